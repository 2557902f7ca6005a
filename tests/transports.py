"""The transports a launch can run on, as pytest parameters: MPI always, UCC where hpccomm has it.

Tests that hold for every transport take ``transport`` (the environment
that selects it) from :data:`TRANSPORTS`. The UCC cases skip, saying why,
only where hpccomm was built without UCC; a UCC binding that is built but
does not load fails them instead.
"""

import pytest
from hpccomm.ucc import binding

#: The environment that routes host tensors to UCC.
ON_UCC = {"HPCCOMM_TRANSPORT": "ucc"}
needs_ucc = pytest.mark.skipif(not binding.built(), reason=binding.BUILT_WITHOUT_UCC)
TRANSPORTS = [pytest.param({}, id="mpi"), pytest.param(ON_UCC, id="ucc", marks=needs_ucc)]
