"""Shared pytest setup: rank scripts import their helpers from tests/ranks; UCC tests skip or fail (tests/transports.py)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


def pytest_configure(config):
    config.addinivalue_line("markers", "needs_ucc: needs hpccomm's UCC binding (tests/transports.py)")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item):
    # In the call phase, so that a UCC test UCC_HOME asks for reads FAILED, not ERROR.
    if item.get_closest_marker("needs_ucc") is not None:
        from transports import require_ucc

        require_ucc()
