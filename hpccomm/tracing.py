"""Keep torch.compile out of hpccomm's own frames.

Inside a compiled region (``torch.compile(DDP(model))``, say) Dynamo sees
every Python frame that starts, hpccomm's methods included when torch's C++
(DDP's reducer, its buffer broadcasts) calls them, and tries to trace them; it
then fails on the group object ("Member '_transports' is not registered for
this opaque object type"). These methods drive MPI and must simply run.

:func:`untraced` marks the code of a class's functions "skip, and skip what
it calls" in Dynamo's frame hook, which then runs them untouched. Unlike
``torch.compiler.disable`` it wraps nothing, so a call costs nothing extra
(a disabled wrapper costs about 1.2 us, a tenth of a small all-reduce). Where a
torch release lacks that hook, the class's methods are wrapped with
``torch.compiler.disable`` instead.
"""

from __future__ import annotations

import types
from typing import TypeVar

import torch

_Class = TypeVar("_Class", bound=type)


def _skip_recursively() -> object | None:
    """Dynamo's "skip this frame and its callees" strategy, or None where this torch has none."""
    try:
        from torch._C._dynamo.eval_frame import _FrameAction, _FrameExecStrategy, set_code_exec_strategy
    except ImportError:
        return None
    strategy = _FrameExecStrategy(_FrameAction.SKIP, _FrameAction.SKIP)
    return lambda code: set_code_exec_strategy(code, strategy)


_mark_code = _skip_recursively()


def untraced(cls: _Class) -> _Class:
    """Class decorator: Dynamo never traces the class's methods (nor what they call)."""
    for name, member in list(vars(cls).items()):
        function = member.__func__ if isinstance(member, (staticmethod, classmethod)) else member
        if isinstance(member, property):
            function = member.fget
        if not isinstance(function, types.FunctionType):
            continue
        if _mark_code is not None:
            _mark_code(function.__code__)
        elif not name.startswith("__") and not isinstance(member, (property, staticmethod, classmethod)):
            setattr(cls, name, torch.compiler.disable(function))
    return cls
