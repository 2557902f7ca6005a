"""The rank scripts' own conventions, read from their source: no MPI, no launch.

``tests/ranks/fast_exit.py`` is the last exit handler only where it is the
first import; and the scripts that stand for a user's program end to end must
not import it, so that hpccomm under a full finalization stays tested.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

RANKS = Path(__file__).parent / "ranks"
#: The scripts that run as a user's program does, up to the interpreter's full finalization.
FULL_FINALIZATION = {"collectives.py", "integrations.py", "dcp.py", "lightning_ddp.py", "accelerate_ddp.py",
                     "torch_suite.py"}

pytestmark = pytest.mark.one_environment


def _imports(path: Path) -> list[str]:
    """The module names a file imports at its top level, in order, ``__future__`` left out."""
    names = []
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module != "__future__":
            names.append(node.module or "")
    return names


def test_fast_exit_is_imported_first_and_never_by_a_users_program():
    importers = []
    for path in sorted(RANKS.glob("*.py")):
        names = _imports(path)
        if "fast_exit" in names:
            importers.append(path.name)
            assert names[0] == "fast_exit", f"{path.name} imports {names[0]} before fast_exit"
    assert len(importers) >= 20, importers  # the convention is in use: this test reads the right folder
    assert not FULL_FINALIZATION & set(importers), FULL_FINALIZATION & set(importers)
    assert all((RANKS / name).exists() for name in FULL_FINALIZATION)
