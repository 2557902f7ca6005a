"""The transports a launch can run on, as pytest parameters: MPI always, UCC where hpccomm has it.

Tests that hold for every transport take ``transport`` (the environment
that selects it) from :data:`TRANSPORTS`. Every UCC test carries
:data:`needs_ucc` (tests/conftest.py acts on it through :func:`require_ucc`):
it skips, saying why, where hpccomm was built without UCC and ``UCC_HOME``
is unset; with ``UCC_HOME`` set (as in CI) an installation without the
binding fails it, and so does a binding that is built but does not load.
"""

import os

import pytest
from hpccomm.ucc import binding

#: The environment that routes host tensors to UCC.
ON_UCC = {"HPCCOMM_TRANSPORT": "ucc"}
#: Marks a test that needs hpccomm's UCC binding.
needs_ucc = pytest.mark.needs_ucc
TRANSPORTS = [pytest.param({}, id="mpi"), pytest.param(ON_UCC, id="ucc", marks=needs_ucc)]


def require_ucc() -> None:
    """Skip the running test where hpccomm has no UCC binding, or fail it where ``UCC_HOME`` asks for one."""
    if binding.built():
        return
    home = os.environ.get("UCC_HOME", "").strip()
    if home:
        pytest.fail(
            f"UCC_HOME is set ({home}) but hpccomm was built without the UCC binding: reinstall hpccomm with "
            "UCC_HOME set (its build says why it left UCC out)",
            pytrace=False,
        )
    pytest.skip(binding.BUILT_WITHOUT_UCC)
