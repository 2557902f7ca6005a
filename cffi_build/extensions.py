"""cffi builders for hpccomm's optional C extensions, one function per extension.

setuptools runs them through ``cffi_modules`` (see setup.py) when the package
is built. Each extension is optional: where it cannot be compiled the install
still succeeds, and hpccomm falls back (16-bit floats reduced with torch;
every collective on MPI's). By hand::

    python cffi_build/extensions.py   # builds both *.so here
"""

from __future__ import annotations

import os
from pathlib import Path

from cffi import FFI

HERE = Path(__file__).resolve().parent


def half_reduce() -> FFI:
    """``hpccomm._half_reduce``: the bfloat16/float16 reduction kernels."""
    return _extension("half_reduce", ["-O3"])


def shm_collectives() -> FFI:
    """``hpccomm._shm_collectives``: the node-local shared-memory collectives engine."""
    # -fwrapv: integer sums and products wrap on overflow, as torch's do.
    return _extension("shm_collectives", ["-O3", "-fwrapv"])


def _extension(stem: str, compile_args: list[str]) -> FFI:
    """``hpccomm._<stem>``, built from ``<stem>.c`` with the declarations of ``<stem>.h``."""
    ffibuilder = FFI()
    # cffi's parser takes declarations only: drop the header's preprocessor lines.
    header = (HERE / f"{stem}.h").read_text()
    ffibuilder.cdef("\n".join(line for line in header.splitlines() if not line.startswith("#")))
    ffibuilder.set_source(
        f"hpccomm._{stem}",
        f'#include "{stem}.h"',
        # setuptools wants paths relative to the project root, where it runs.
        sources=[os.path.relpath(HERE / f"{stem}.c")],
        include_dirs=[os.path.relpath(HERE)],
        extra_compile_args=compile_args,
        optional=True,
    )
    return ffibuilder


if __name__ == "__main__":
    for build in (half_reduce, shm_collectives):
        build().compile(verbose=True)
