"""Where torch (2.14, 2.15) falls short for a Python ``Backend``, and how hpccomm makes up for it.

Each mend below patches one torch function, only where torch lacks what a
Python backend needs, and leaves every other backend's behaviour as it was.
:func:`mend` applies them (idempotent); registration calls it when hpccomm
takes the Backend shape (:data:`hpccomm.registration.BACKEND_SHAPE`). What
is not mended is in docs/known-limits.md.
"""

from __future__ import annotations

from typing import Any

import torch

from .front import Front
from .work import work_behind


def mend() -> None:
    """Apply every mend below (idempotent)."""
    _ask_hpccomm_works_through_their_holder()
    _check_in_detail_mode_without_torchs_wrapper()
    _register_shrunk_groups_as_custom()


#: The Work methods torch's holder answers for itself: ``is_completed()`` was never True,
#: ``result()`` and ``_source_rank()`` raised (so ``recv(src=None)`` failed).
_HELD_BACK = ("is_completed", "is_success", "exception", "result", "_source_rank")


def _ask_hpccomm_works_through_their_holder() -> None:
    """Make torch's Work holder answer :data:`_HELD_BACK` with the hpccomm Work it holds.

    torch wraps the Work a Python backend returns in a C++ holder that passes
    on only ``wait()`` and ``get_future()``; the rest answered for the holder,
    which never completes (torch's own ``test_irecv`` asserts
    ``is_completed()`` after ``wait()``). Each method now asks the hpccomm
    Work behind the holder (:func:`~hpccomm.work.work_behind`); other
    backends' works keep torch's answer.
    """
    from torch._C._distributed_c10d import Work

    for name in _HELD_BACK:
        original = getattr(Work, name)
        if not getattr(original, "hpccomm", False):
            setattr(Work, name, _asking_hpccomm_first(name, original))


def _asking_hpccomm_first(name: str, original: Any) -> Any:
    def method(self: Any, *args: Any) -> Any:
        inner = work_behind(self)
        if inner is None:
            return original(self, *args)
        own = getattr(type(inner), name)
        # An hpccomm Work without its own answer (a blocking call's has no source rank) gets torch's.
        return original(inner, *args) if getattr(own, "hpccomm", False) else own(inner, *args)

    method.__name__ = name
    method.hpccomm = True  # type: ignore[attr-defined]
    return method


def _check_in_detail_mode_without_torchs_wrapper() -> None:
    """Under ``TORCH_DISTRIBUTED_DEBUG=DETAIL``, let hpccomm's checks stand in for torch's wrapper.

    In that mode torch wraps each plugin backend in its ProcessGroupWrapper,
    whose cross-rank checks run over Gloo; that wrapper has no
    ``getBackendName``, which torch's ProcessGroup asks a custom backend for
    on every operation ("getBackendName is not implemented", torch 2.15), so
    no operation could run. hpccomm turns on its own checks in that mode
    (:mod:`hpccomm.debug`: op, dtype, sizes and root agreed across ranks
    before anything is posted), so its groups are left unwrapped.
    """
    from torch.distributed import distributed_c10d

    original = getattr(distributed_c10d, "_create_process_group_wrapper", None)
    if original is None or getattr(original, "hpccomm", False):
        return

    def create_wrapper(wrapped_pg: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(wrapped_pg, Front):
            return wrapped_pg
        return original(wrapped_pg, *args, **kwargs)

    create_wrapper.hpccomm = True  # type: ignore[attr-defined]
    distributed_c10d._create_process_group_wrapper = create_wrapper


def _register_shrunk_groups_as_custom() -> None:
    """Make ``dist.shrink_group`` register a shrunk hpccomm group as the custom backend it is.

    torch (2.14, 2.15) registers the backend that ``shrink`` returns as Gloo's
    for CPU groups (NCCL's for CUDA), whatever backend it is. DDP's logger
    then takes the group for Gloo and casts its backend to ProcessGroupGloo
    to read Gloo's settings: with hpccomm's backend there, DDP built on a
    shrunk group crashed the interpreter (segmentation fault, 4 of 7 runs at
    4 ranks). A shrunk hpccomm group is registered as ``CUSTOM``, as
    ``init_process_group`` registers hpccomm's groups; other backends' shrunk
    groups are left as torch makes them.
    """
    from torch.distributed import distributed_c10d

    original = getattr(distributed_c10d, "_create_shrunk_process_group", None)
    if original is None or getattr(original, "hpccomm", False):
        return

    def create_shrunk(new_backend: Any, *args: Any, **kwargs: Any) -> Any:
        group = original(new_backend, *args, **kwargs)
        if isinstance(new_backend, Front):
            custom = group.BackendType.CUSTOM
            for device_type in group._device_types:
                group._register_backend(torch.device(device_type), custom, new_backend)
            group._set_default_backend(custom)
        return group

    create_shrunk.hpccomm = True  # type: ignore[attr-defined]
    distributed_c10d._create_shrunk_process_group = create_shrunk
