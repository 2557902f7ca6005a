"""Metadata lives in pyproject.toml; this adds the optional cffi extensions.

``hpccomm._half_reduce`` and ``hpccomm._shm_collectives`` (built from cffi_build/)
are optional: where they cannot be compiled the install still succeeds,
bfloat16/float16 reductions use torch and every collective goes through MPI's.
``hpccomm._ucc``, the UCC binding, is built only where UCC is
found (``UCC_HOME``, else ``pkg-config ucc``); the build says which, once.
"""

import importlib.util
from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext

_BUILDERS = "cffi_build/extensions.py"


def _load_builders():
    spec = importlib.util.spec_from_file_location("hpccomm_cffi_builders", Path(__file__).parent / _BUILDERS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


UCC, UCC_SAYS = _load_builders().find_ucc()


class BuildExtensions(build_ext):
    """build_ext that first says whether the UCC binding is built and against what.

    Without UCC it also removes a binding an earlier build left (in the build
    directory, which pip reuses in the source tree, and beside the sources for
    an editable install): otherwise it would be installed again, against a UCC
    that may no longer be there.
    """

    def run(self):
        if UCC is None:
            print(f"hpccomm: building without UCC ({UCC_SAYS}); set UCC_HOME to a UCC installation for the UCC transport")
            for directory in (Path(self.build_lib) / "hpccomm", *([Path(__file__).parent / "hpccomm"] if self.inplace else [])):
                for stale in directory.glob("_ucc.*so"):
                    print(f"hpccomm: removing {stale}, an earlier build's UCC binding")
                    stale.unlink()
        else:
            print(f"hpccomm: building the UCC binding against {UCC_SAYS}")
        super().run()


setup(
    cffi_modules=[
        f"{_BUILDERS}:half_reduce",
        f"{_BUILDERS}:shm_collectives",
        *([f"{_BUILDERS}:ucc"] if UCC is not None else []),
    ],
    cmdclass={"build_ext": BuildExtensions},
)
