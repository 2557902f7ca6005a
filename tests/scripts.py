"""Scripts that live in no package, loaded as modules for their tests.

The benchmarks, tests/gpu's programs and the docs' hooks are run as files
(``python benchmarks/cuda_allreduce.py``, ``python3 tests/gpu/targets.py``,
MkDocs' hooks); their tests call their functions, so they load each by its
path, under the name given (by default the file's stem).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]


def load_script(path: Path, name: str | None = None) -> ModuleType:
    """The module that ``path`` (a Python file in no package) defines, run once, as ``name`` or its stem.

    Args:
        path: the script, e.g. ``REPO / "tests" / "gpu" / "targets.py"``.
        name: the module's ``__name__``; by default ``path.stem``.
    """
    spec = importlib.util.spec_from_file_location(name or path.stem, path)
    module = importlib.util.module_from_spec(spec)
    # Where no module of that name is loaded, by that name too: a dataclass looks its module up there.
    sys.modules.setdefault(spec.name, module)
    spec.loader.exec_module(module)
    return module
