"""Metadata lives in pyproject.toml; this adds the optional cffi extensions.

``hpccomm._half_reduce`` and ``hpccomm._shm_allreduce`` (built from cffi_build/)
are optional: where they cannot be compiled the install still succeeds,
bfloat16/float16 reductions use torch and all-reduce always goes through MPI's
collectives.
"""

from setuptools import setup

setup(
    cffi_modules=[
        "cffi_build/extensions.py:half_reduce",
        "cffi_build/extensions.py:shm_allreduce",
    ]
)
