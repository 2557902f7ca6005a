"""Metadata lives in pyproject.toml; this adds the optional cffi kernels.

``hpccomm._half_reduce`` (cffi_build/) is marked optional: where it cannot be
compiled, the install still succeeds and bfloat16/float16 reductions use torch.
"""

from setuptools import setup

setup(cffi_modules=["cffi_build/half_reduce_build.py:ffibuilder"])
