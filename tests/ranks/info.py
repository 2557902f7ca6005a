"""Run ``python -m hpccomm info`` in a rank (tests/test_info.py)."""

import fast_exit  # noqa: F401  (first: its gc.freeze is the last exit handler; see that module)
import sys

from hpccomm.cli import info

if __name__ == "__main__":
    info.main(sys.argv[1:])
