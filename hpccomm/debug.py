"""Debug mode: check across ranks that a collective's calls agree.

With ``HPCCOMM_DEBUG=1`` (or ``TORCH_DISTRIBUTED_DEBUG=DETAIL``) every
collective first exchanges a small signature (op, sequence number, dtype,
element counts, root, reduce op) over a separate communicator. If the ranks
disagree, every rank raises the same RuntimeError with a table of each rank's
call, instead of hanging or reading the wrong bytes. The exchange is bounded
by the group's timeout, so a rank that never arrives is named as well.

Signatures are pickled; they only ever come from ranks of the same job over
MPI.
"""

from __future__ import annotations

import pickle
import time
from array import array
from typing import Any

from .world import mpi

# all_to_all_single: what rank i sends to j must be what j receives from i.
_MATRIX_KEYS = ("sends", "receives")


class CollectiveMismatchError(RuntimeError):
    """Ranks of a group called different collectives, or with different arguments."""


class Checker:
    """Compares each collective's signature across the ranks of one group.

    Args:
        comm: a communicator over the group's ranks, used only for checks.
        timeout_s: how long to wait for the other ranks' signatures.
    """

    def __init__(self, comm: Any, timeout_s: float) -> None:
        self._comm = comm
        self._timeout_s = timeout_s

    def agree(self, op: str, seq: int, group: str, signature: dict[str, object]) -> None:
        """Raise CollectiveMismatchError on every rank unless all ranks' calls match.

        Args:
            op: the collective's name.
            seq: its sequence number on the group.
            group: the group's description, for messages.
            signature: what must agree (dtype, element counts, root, op).
        """
        where = f"hpccomm {op} #{seq} on {group}"
        mine = {"op": op, "seq": seq, **{k: _plain(v) for k, v in signature.items()}}
        calls = self._exchange(where, mine)
        problem = _disagreement(calls)
        if problem:
            raise CollectiveMismatchError(f"{where}: ranks disagree ({problem}):\n{_table(calls)}")

    def _exchange(self, where: str, mine: dict[str, object]) -> list[dict[str, object]]:
        MPI = mpi()
        payload = pickle.dumps(mine)
        size = self._comm.Get_size()
        deadline = time.monotonic() + self._timeout_s
        lengths = array("q", [0] * size)
        request = self._comm.Iallgather((array("q", [len(payload)]), MPI.INT64_T), (lengths, MPI.INT64_T))
        if not _wait(request, deadline):
            raise CollectiveMismatchError(
                f"{where}: not every rank reached this collective within {self._timeout_s:.1f} s "
                "(debug-mode check)"
            )
        counts = list(lengths)
        blob = bytearray(sum(counts))
        displacements = [sum(counts[:i]) for i in range(size)]
        request = self._comm.Iallgatherv((payload, MPI.BYTE), (blob, counts, displacements, MPI.BYTE))
        if not _wait(request, deadline):
            raise CollectiveMismatchError(f"{where}: signature exchange timed out")
        return [pickle.loads(bytes(blob[d : d + n])) for d, n in zip(displacements, counts)]

    def close(self) -> None:
        """Free the check communicator."""
        if self._comm is not None:
            self._comm.Free()
            self._comm = None


def _wait(request: Any, deadline: float) -> bool:
    while not request.Test():
        if time.monotonic() > deadline:
            return False
    return True


def _plain(value: object) -> object:
    """Make torch enums and dtypes comparable and printable after pickling."""
    if isinstance(value, (int, float, str, bool, type(None))):
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return str(value)


def _disagreement(calls: list[dict[str, object]]) -> str:
    keys = set().union(*calls)
    for key in sorted(keys - set(_MATRIX_KEYS)):
        values = [call.get(key) for call in calls]
        if any(v != values[0] for v in values):
            return f"'{key}' differs"
    if all(k in calls[0] for k in _MATRIX_KEYS):
        for i, call in enumerate(calls):
            for j, other in enumerate(calls):
                if call["sends"][j] != other["receives"][i]:
                    return f"rank {i} sends {call['sends'][j]} elements to rank {j}, which expects {other['receives'][i]}"
    return ""


def _table(calls: list[dict[str, object]]) -> str:
    keys = ["op", "seq", *sorted(set().union(*calls) - {"op", "seq"})]
    rows = [["rank", *keys]] + [[str(rank), *(str(call.get(k, "-")) for k in keys)] for rank, call in enumerate(calls)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)) for row in rows)
