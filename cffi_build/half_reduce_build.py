"""cffi builder for ``hpccomm._half_reduce``, the bfloat16/float16 reduction kernels.

setuptools runs it through ``cffi_modules`` (see setup.py) when the package is
built; the extension is optional, so a machine without a C compiler still
installs hpccomm and reduces 16-bit floats with torch instead. By hand::

    python cffi_build/half_reduce_build.py   # builds _half_reduce*.so here
"""

from __future__ import annotations

import os
from pathlib import Path

from cffi import FFI

HERE = Path(__file__).resolve().parent
HEADER = HERE / "half_reduce.h"
SOURCE = HERE / "half_reduce.c"

ffibuilder = FFI()
# cffi's parser takes declarations only: drop the header's preprocessor lines.
ffibuilder.cdef("\n".join(line for line in HEADER.read_text().splitlines() if not line.startswith("#")))
ffibuilder.set_source(
    "hpccomm._half_reduce",
    '#include "half_reduce.h"',
    # setuptools wants paths relative to the project root, where it runs.
    sources=[os.path.relpath(SOURCE)],
    include_dirs=[os.path.relpath(HERE)],
    extra_compile_args=["-O3"],
    optional=True,
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
