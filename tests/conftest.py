"""Shared pytest setup: rank scripts import their helpers from tests/ranks; UCC tests skip or fail (tests/transports.py);
the shared-memory files of MPI ranks a test killed, and what its killed launchers left in the temporary directory, go
with the test (tests/mpi_leftovers.py)."""

import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _prefer_the_installed_hpccomm() -> None:
    """Import the hpccomm the rank scripts import: the installed one, with its compiled extensions.

    ``python -m pytest`` puts the checkout first on ``sys.path``, whose
    ``hpccomm`` has no compiled extensions (the UCC binding among them) unless
    it was installed editable. Where hpccomm is installed, the checkout's
    entry goes; where it is not, the tests import the checkout as before.
    """
    checkout = [entry for entry in sys.path if Path(entry or ".").resolve() == REPO]
    if not checkout:
        return
    saved = sys.path[:]
    sys.path[:] = [entry for entry in sys.path if entry not in checkout]
    importlib.invalidate_caches()
    if importlib.util.find_spec("hpccomm") is None:
        sys.path[:] = saved


_prefer_the_installed_hpccomm()
sys.path.insert(0, str(Path(__file__).parent))

import mpi_leftovers  # noqa: E402  (from tests/, just put on the path)


def pytest_configure(config):
    config.addinivalue_line("markers", "needs_ucc: needs hpccomm's UCC binding (tests/transports.py)")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item):
    # In the call phase, so that a UCC test UCC_HOME asks for reads FAILED, not ERROR.
    if item.get_closest_marker("needs_ucc") is not None:
        from transports import require_ucc

        require_ucc()


@pytest.fixture(scope="session", autouse=True)
def _mpi_shared_memory_of_the_session():
    # Last, the files still in use when their test ended (a Slurm job of the batch running on).
    before, launchers_before = mpi_leftovers.mpi_files(), mpi_leftovers.launcher_files_everywhere()
    yield
    mpi_leftovers.remove_left(before)
    mpi_leftovers.remove_launcher_leftovers_everywhere(launchers_before)


@pytest.fixture(autouse=True)
def _no_mpi_shared_memory_left(_mpi_shared_memory_of_the_session):
    before, launchers_before = mpi_leftovers.mpi_files(), mpi_leftovers.launcher_files_everywhere()
    yield
    mpi_leftovers.remove_left(before)
    mpi_leftovers.remove_launcher_leftovers_everywhere(launchers_before)
