"""``python -m hpccomm_run``: the same as ``hpccomm-run``."""

from . import main

main()
