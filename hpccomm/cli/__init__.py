"""Command-line tools, apart from the backend: ``python -m hpccomm bench`` and ``python -m hpccomm info``.

| module | what |
|---|---|
| ``bench`` | the sweep's command line, driver and report (table, JSON) |
| ``collectives`` | per collective: sizes, busbw factor, buffers, expected results |
| ``contenders`` | hpccomm and Gloo through torch.distributed, raw mpi4py |
| ``sweep`` | the timing loop: interleaved rounds, slowest rank's median |
| ``model`` | the training-step benchmark (DDP, FSDP2) |
| ``info`` | ``python -m hpccomm info`` |
| ``environment`` | versions, MPI, paths, knobs, layout (info and the bench's JSON) |
| ``console``, ``table`` | rank 0's output, progress bar, clean stop; table formatting |
| ``plot`` | the only module that imports matplotlib (``hpccomm[plot]``) |

Nothing in the backend imports this package.
"""
