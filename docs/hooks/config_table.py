"""MkDocs hook: the configuration page's table, generated from ``hpccomm/config.py``.

``docs/configuration.md`` holds the marker ``<!-- config-table -->``; this hook
replaces it with one row per field of :class:`hpccomm.config.Config`: the
environment variable and the text of the field's entry in the class
docstring, and the default, read by running ``config.py``'s own reader in an
environment without hpccomm's variables. The table therefore cannot drift from
the code; ``tests/test_docs.py`` checks that every variable ``config.py``
reads has a row.

``config.py`` is loaded from its file, not imported as ``hpccomm.config``:
importing the package imports torch, which building the docs does not need.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any
from unittest import mock

MARKER = "<!-- config-table -->"
CONFIG_PY = Path(__file__).resolve().parents[2] / "hpccomm" / "config.py"
#: Variables that change the defaults config.py reads.
_READ_BY_CONFIG = re.compile(r"^(HPCCOMM_|TORCH_DISTRIBUTED_DEBUG$)")


def load_config_module() -> ModuleType:
    """``hpccomm/config.py`` as a module of its own, read in an environment without its variables."""
    clean = {name: value for name, value in os.environ.items() if not _READ_BY_CONFIG.match(name)}
    spec = importlib.util.spec_from_file_location("_hpccomm_config_for_docs", CONFIG_PY)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # dataclasses look the module up in sys.modules while the class is made.
    with mock.patch.dict(os.environ, clean, clear=True), mock.patch.dict(sys.modules, {spec.name: module}):
        spec.loader.exec_module(module)
    return module


def field_docs(docstring: str) -> dict[str, str]:
    """The ``Attributes:`` entries of a Google-style docstring: name -> text on one line."""
    entries: dict[str, str] = {}
    section = docstring.split("Attributes:", 1)[1]
    current = None
    for line in section.splitlines():
        entry = re.match(r"^ {8}(\w+): (.*)$", line)
        if entry:
            current = entry.group(1)
            entries[current] = entry.group(2).strip()
        elif current and line.startswith(" " * 12):
            entries[current] += " " + line.strip()
        elif line.strip():
            break
    return entries


def show_default(value: Any) -> str:
    """A default as the table shows it."""
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, int):
        return f"`{value}` ({value >> 20} MiB)" if value and value % (1 << 20) == 0 else f"`{value}`"
    if isinstance(value, tuple):  # (device, transport) pairs
        transports = {transport for _device, transport in value}
        return f"`{transports.pop()}`" if len(transports) == 1 else ", ".join(f"`{d}:{t}`" for d, t in value)
    return f"`{value}`"


def rows() -> list[tuple[str, str, str]]:
    """(variable, default, effect) for every field of ``Config``."""
    config = load_config_module()
    docs = field_docs(config.Config.__doc__ or "")
    defaults = config.settings
    table = []
    for field in config.Config.__dataclass_fields__:
        text = docs.get(field)
        if text is None:
            raise ValueError(f"hpccomm/config.py: Config's docstring has no entry for field {field!r}")
        variable = re.search(r"HPCCOMM_[A-Z0-9_]+", text)
        if variable is None:
            raise ValueError(f"hpccomm/config.py: Config's entry for {field!r} names no HPCCOMM_ variable")
        # The entry opens with its variable ("``HPCCOMM_ALGO``: ..."), which the table's first column shows.
        effect = re.sub(r"^``HPCCOMM_[A-Z0-9_]+``: ", "", text).replace("``", "`")
        table.append((variable.group(0), show_default(getattr(defaults, field)), effect))
    return table


def markdown_table() -> str:
    """The table, in Markdown."""
    lines = ["| variable | default | effect |", "|---|---|---|"]
    lines += [f"| `{variable}` | {default} | {effect} |" for variable, default, effect in rows()]
    return "\n".join(lines)


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    """MkDocs event: put the table where the configuration page has the marker."""
    if MARKER in markdown:
        markdown = markdown.replace(MARKER, markdown_table())
    return markdown
