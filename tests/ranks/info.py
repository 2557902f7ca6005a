"""Run ``python -m hpccomm info`` in a rank (tests/test_info.py)."""

import sys

from hpccomm.cli import info

if __name__ == "__main__":
    info.main(sys.argv[1:])
