"""Metadata lives in pyproject.toml; this adds the optional cffi extensions.

``hpccomm._half_reduce`` and ``hpccomm._shm_collectives`` (built from cffi_build/)
are optional: where they cannot be compiled the install still succeeds,
bfloat16/float16 reductions use torch and every collective goes through MPI's.
"""

from setuptools import setup

setup(
    cffi_modules=[
        "cffi_build/extensions.py:half_reduce",
        "cffi_build/extensions.py:shm_collectives",
    ]
)
