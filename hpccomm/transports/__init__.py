"""Transports: how one group moves tensors of one device type.

The front (:mod:`hpccomm.process_group`) validates arguments and then hands
plain tensors to the transport registered for their device. A transport
posts the communication and returns a :class:`~hpccomm.work.Pending`; the
Work and progress machinery is shared by all transports. Adding a transport
(UCC for CUDA tensors, say) means implementing :class:`Transport` and
registering a factory for its device type; the front does not change.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ..work import Pending
from .mpi_types import Reduction


class Transport:
    """The operations a transport offers one process group.

    Every method receives validated tensors (right sizes, one device, dense)
    and returns a Pending that completes the operation. Methods may assume
    that every member of the group makes the same call in the same order.
    """

    def allreduce(self, tensors: Sequence[torch.Tensor], reduction: Reduction) -> Pending:
        raise NotImplementedError

    def broadcast(self, tensor: torch.Tensor, root: int) -> Pending:
        raise NotImplementedError

    def reduce(self, tensor: torch.Tensor, root: int, reduction: Reduction) -> Pending:
        raise NotImplementedError

    def allgather(self, outputs: Sequence[torch.Tensor], tensor: torch.Tensor) -> Pending:
        raise NotImplementedError

    def allgather_into(self, output: torch.Tensor, tensor: torch.Tensor) -> Pending:
        raise NotImplementedError

    def gather(self, outputs: Sequence[torch.Tensor] | None, tensor: torch.Tensor, root: int) -> Pending:
        raise NotImplementedError

    def scatter(self, output: torch.Tensor, inputs: Sequence[torch.Tensor] | None, root: int) -> Pending:
        raise NotImplementedError

    def reduce_scatter(self, output: torch.Tensor, inputs: Sequence[torch.Tensor], reduction: Reduction) -> Pending:
        raise NotImplementedError

    def reduce_scatter_from(self, output: torch.Tensor, tensor: torch.Tensor, reduction: Reduction) -> Pending:
        raise NotImplementedError

    def alltoall(self, outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor]) -> Pending:
        raise NotImplementedError

    def alltoall_single(
        self, output: torch.Tensor, tensor: torch.Tensor, output_counts: Sequence[int], input_counts: Sequence[int]
    ) -> Pending:
        raise NotImplementedError

    def barrier(self) -> Pending:
        raise NotImplementedError

    def send(self, tensor: torch.Tensor, peer: int, tag: int) -> Pending:
        raise NotImplementedError

    def recv(self, tensor: torch.Tensor, peer: int | None, tag: int) -> Pending:
        """Receive from ``peer``, or from any rank when ``peer`` is None."""
        raise NotImplementedError

    def communicators(self) -> list[Any]:
        """The MPI communicators the transport's operations run on (fault-tolerant mode revokes them)."""
        return []

    def close(self, in_flight: bool = False) -> None:
        """Release the transport's resources; no operation follows.

        Args:
            in_flight: some operation ended without its communication
                completing (a timeout, a departed peer, an abort), so the
                library may still work on it: keep what it can still touch.
        """



class WrappingTransport(Transport):
    """A transport that hands every operation to ``inner`` through one hook, :meth:`_post`.

    A subclass changes how operations are posted, or what their Pendings do
    (fault tolerance's error translation, a device path's ordering), in one
    method instead of one per operation.

    Args:
        inner: the transport that communicates (closed with this one).
    """

    def __init__(self, inner: Transport) -> None:
        self.inner = inner

    def _post(self, op: str, *args: Any) -> Pending:
        """Post operation ``op`` (a :class:`Transport` method name) with ``args``."""
        return getattr(self.inner, op)(*args)

    def allreduce(self, tensors: Sequence[torch.Tensor], reduction: Reduction) -> Pending:
        return self._post("allreduce", tensors, reduction)

    def broadcast(self, tensor: torch.Tensor, root: int) -> Pending:
        return self._post("broadcast", tensor, root)

    def reduce(self, tensor: torch.Tensor, root: int, reduction: Reduction) -> Pending:
        return self._post("reduce", tensor, root, reduction)

    def allgather(self, outputs: Sequence[torch.Tensor], tensor: torch.Tensor) -> Pending:
        return self._post("allgather", outputs, tensor)

    def allgather_into(self, output: torch.Tensor, tensor: torch.Tensor) -> Pending:
        return self._post("allgather_into", output, tensor)

    def gather(self, outputs: Sequence[torch.Tensor] | None, tensor: torch.Tensor, root: int) -> Pending:
        return self._post("gather", outputs, tensor, root)

    def scatter(self, output: torch.Tensor, inputs: Sequence[torch.Tensor] | None, root: int) -> Pending:
        return self._post("scatter", output, inputs, root)

    def reduce_scatter(self, output: torch.Tensor, inputs: Sequence[torch.Tensor], reduction: Reduction) -> Pending:
        return self._post("reduce_scatter", output, inputs, reduction)

    def reduce_scatter_from(self, output: torch.Tensor, tensor: torch.Tensor, reduction: Reduction) -> Pending:
        return self._post("reduce_scatter_from", output, tensor, reduction)

    def alltoall(self, outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor]) -> Pending:
        return self._post("alltoall", outputs, inputs)

    def alltoall_single(
        self, output: torch.Tensor, tensor: torch.Tensor, output_counts: Sequence[int], input_counts: Sequence[int]
    ) -> Pending:
        return self._post("alltoall_single", output, tensor, output_counts, input_counts)

    def barrier(self) -> Pending:
        return self._post("barrier")

    def send(self, tensor: torch.Tensor, peer: int, tag: int) -> Pending:
        return self._post("send", tensor, peer, tag)

    def recv(self, tensor: torch.Tensor, peer: int | None, tag: int) -> Pending:
        return self._post("recv", tensor, peer, tag)

    def communicators(self) -> list[Any]:
        return self.inner.communicators()

    def close(self, in_flight: bool = False) -> None:
        self.inner.close(in_flight)
