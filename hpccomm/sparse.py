"""Sparse (COO) all-reduce, as Gloo offers it: SUM only.

Every rank's non-zeros are gathered to every rank and summed there: first
the non-zero counts (one all-gather of one number per rank), then the
indices and values (two uneven all-gathers), then a local coalesce that adds
up the entries ranks share. The result replaces the tensor in place, as
torch's API expects. Two rounds of communication, so the Pending posts the
second when the first completes; it works on any transport's all-gathers.
"""

from __future__ import annotations

import torch

from .transports import Transport
from .work import AllPending, Pending


class SparseAllreduce:
    """A Pending summing a sparse COO ``tensor`` over the group, in place.

    Args:
        transport: the group's transport for the tensor's device.
        tensor: the sparse COO tensor; replaced by the sum once complete.
        size: the number of ranks in the group.
    """

    #: The path that serves it, as the profiler names it (:mod:`hpccomm.profiling`).
    path = "sparse"

    def __init__(self, transport: Transport, tensor: torch.Tensor, size: int) -> None:
        self._transport = transport
        self._tensor = tensor
        mine = tensor.coalesce()
        self._indices = mine.indices().contiguous()
        self._values = mine.values().contiguous()
        self._counts = torch.empty(size, dtype=torch.int64)
        self._stage: Pending = transport.allgather_into(self._counts, torch.tensor([self._values.size(0)]))
        self._gathered: tuple[list[torch.Tensor], list[torch.Tensor]] | None = None

    def test(self) -> bool:
        if not self._stage.test():
            return False
        if self._gathered is None:
            self._stage.finish()
            self._stage = self._post_entries()
            return self._stage.test()
        return True

    def _post_entries(self) -> Pending:
        counts = self._counts.tolist()
        sparse_dims = self._indices.size(0)
        entry_shape = self._values.shape[1:]
        indices = [torch.empty(sparse_dims, n, dtype=torch.int64) for n in counts]
        values = [torch.empty(n, *entry_shape, dtype=self._values.dtype) for n in counts]
        self._gathered = (indices, values)
        return AllPending(
            [self._transport.allgather(indices, self._indices), self._transport.allgather(values, self._values)]
        )

    def finish(self) -> None:
        self._stage.finish()
        indices, values = self._gathered
        total = torch.sparse_coo_tensor(torch.cat(indices, dim=1), torch.cat(values), self._tensor.shape)
        self._tensor.copy_(total.coalesce())
