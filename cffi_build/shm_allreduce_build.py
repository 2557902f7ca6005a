"""cffi builder for ``hpccomm._shm_allreduce``, the node-local shared-memory all-reduce engine.

Run by setuptools through ``cffi_modules`` (see setup.py); optional like the
other builders: without it hpccomm's all-reduce never takes the shared-memory
path. By hand::

    python cffi_build/shm_allreduce_build.py   # builds _shm_allreduce*.so here
"""

from __future__ import annotations

import os
from pathlib import Path

from cffi import FFI

HERE = Path(__file__).resolve().parent
HEADER = HERE / "shm_allreduce.h"
SOURCE = HERE / "shm_allreduce.c"

ffibuilder = FFI()
# cffi's parser takes declarations only: drop the header's preprocessor lines.
ffibuilder.cdef("\n".join(line for line in HEADER.read_text().splitlines() if not line.startswith("#")))
ffibuilder.set_source(
    "hpccomm._shm_allreduce",
    '#include "shm_allreduce.h"',
    # setuptools wants paths relative to the project root, where it runs.
    sources=[os.path.relpath(SOURCE)],
    include_dirs=[os.path.relpath(HERE)],
    # -fwrapv: integer sums and products wrap on overflow, as torch's do.
    extra_compile_args=["-O3", "-fwrapv"],
    optional=True,
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
