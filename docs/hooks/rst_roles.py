"""MkDocs hook: drop the reST roles (``:func:``, ``:class:`` ...) that hpccomm's docstrings use.

The docstrings are read in Python's own tooling and in this site; in the
site, mkdocstrings renders ``:func:`topology``` as the text ":func:" before
the code ``topology``. This keeps the code and drops the role's name.
"""

from __future__ import annotations

import re
from typing import Any

ROLE_BEFORE_CODE = re.compile(r":(?:func|class|meth|mod|data|attr|exc|obj):(?=<code>)")


def on_page_content(html: str, **_: Any) -> str:
    """MkDocs event: the page's HTML without role names in front of code spans."""
    return ROLE_BEFORE_CODE.sub("", html)
