"""cffi builders for hpccomm's optional C extensions, one function per extension.

setuptools runs them through ``cffi_modules`` (see setup.py) when the package
is built. Each extension is optional: where it cannot be compiled the install
still succeeds, and hpccomm falls back (16-bit floats reduced with torch;
all collectives on MPI's; no UCC transport). By hand::

    python cffi_build/extensions.py   # builds every *.so it can here
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import NamedTuple

from cffi import FFI

HERE = Path(__file__).resolve().parent


def half_reduce() -> FFI:
    """``hpccomm._half_reduce``: the bfloat16/float16 reduction kernels."""
    return _extension("half_reduce", ["-O3"])


def shm_collectives() -> FFI:
    """``hpccomm._shm_collectives``: the node-local shared-memory collectives engine."""
    # -fwrapv: integer sums and products wrap on overflow, as torch's do.
    return _extension("shm_collectives", ["-O3", "-fwrapv"])


def ucc() -> FFI:
    """``hpccomm._ucc``: the UCC binding, compiled against the UCC :func:`find_ucc` finds.

    API mode: the compiler reads UCC's real ``ucc.h``, so values and struct
    layouts come from the installed UCC, not from ``ucc_api.cdef``.

    Raises:
        RuntimeError: no UCC was found (setup.py only calls this when one is).
    """
    found, reason = find_ucc()
    if found is None:
        raise RuntimeError(f"hpccomm: cannot build the UCC binding: {reason}")
    return _extension(
        "ucc",
        ["-O2"],
        api_cdef=(HERE / "ucc_api.cdef").read_text(),
        include_dirs=[found.include_dir],
        library_dirs=[found.library_dir],
        libraries=["ucc"],
        # No LD_LIBRARY_PATH needed at run time.
        runtime_library_dirs=[found.library_dir],
    )


class UCCInstall(NamedTuple):
    """Where a UCC installation's header and library are.

    Attributes:
        include_dir: holds ``ucc/api/ucc.h``.
        library_dir: holds ``libucc.so``.
    """

    include_dir: str
    library_dir: str


def find_ucc() -> tuple[UCCInstall | None, str]:
    """Find UCC through ``UCC_HOME``, else ``pkg-config ucc``.

    Returns:
        ``(install, description)``, or ``(None, why not)``.
    """
    home = os.environ.get("UCC_HOME", "").strip()
    if home:
        return _install_at(Path(home), f"UCC_HOME={home}")
    if shutil.which("pkg-config") is None:
        return None, "UCC_HOME is not set and pkg-config is not installed"
    try:
        include, library = (
            subprocess.run(["pkg-config", f"--variable={name}", "ucc"], capture_output=True, text=True, check=True)
            .stdout.strip()
            for name in ("includedir", "libdir")
        )
    except subprocess.CalledProcessError:
        return None, "UCC_HOME is not set and `pkg-config ucc` finds no ucc.pc"
    if not include or not library:
        return None, "`pkg-config ucc` names no includedir or libdir"
    return _install_at(Path(include).parent, "pkg-config ucc", Path(include), Path(library))


def _install_at(
    prefix: Path, source: str, include: Path | None = None, library: Path | None = None
) -> tuple[UCCInstall | None, str]:
    include = include or prefix / "include"
    if not (include / "ucc" / "api" / "ucc.h").is_file():
        return None, f"{source}: no {include}/ucc/api/ucc.h"
    candidates = [library] if library else [prefix / "lib", prefix / "lib64"]
    for directory in candidates:
        if any(directory.glob("libucc.so*")):
            found = UCCInstall(str(include), str(directory))
            return found, f"UCC from {source} ({directory})"
    return None, f"{source}: no libucc.so in {' or '.join(map(str, candidates))}"


def _extension(stem: str, compile_args: list[str], api_cdef: str = "", **build: list[str]) -> FFI:
    """``hpccomm._<stem>``, built from ``<stem>.c`` with the declarations of ``<stem>.h``.

    Args:
        stem: names the module and its C files.
        compile_args: extra compiler flags.
        api_cdef: declarations of a library's API (cffi syntax) that
            ``<stem>.h`` builds on.
        build: more of setuptools' Extension arguments (include_dirs,
            library_dirs, libraries, runtime_library_dirs).
    """
    ffibuilder = FFI()
    # cffi's parser takes declarations only: drop the header's preprocessor lines.
    header = (HERE / f"{stem}.h").read_text()
    ffibuilder.cdef(api_cdef + "\n".join(line for line in header.splitlines() if not line.startswith("#")))
    ffibuilder.set_source(
        f"hpccomm._{stem}",
        f'#include "{stem}.h"',
        # setuptools wants paths relative to the project root, where it runs.
        sources=[os.path.relpath(HERE / f"{stem}.c")],
        include_dirs=[os.path.relpath(HERE), *build.pop("include_dirs", [])],
        extra_compile_args=compile_args,
        optional=True,
        **build,
    )
    return ffibuilder


if __name__ == "__main__":
    builders = [half_reduce, shm_collectives]
    if find_ucc()[0] is not None:
        builders.append(ucc)
    for build in builders:
        build().compile(verbose=True)
