"""Departure news over a tree: how every rank learns who left, at a few messages a rank whatever the job's size.

A rank that leaves the job says so (:mod:`hpccomm.failure`). Told to every
other rank, that is N-1 messages a rank and N(N-1) for a job that ends, all at
its last moment (16.8 million at 4,096 ranks), and across nodes a connection
between every pair of ranks. Here a departure is a *record* that travels a
tree of the world's ranks instead: a leaving rank gives its record to its tree
neighbours, and each rank passes the records it learns to its other
neighbours, many records a message. Each record crosses each edge of the tree
once, so a rank sends a message to each of its at most ``FANOUT + 1``
neighbours per batch of news, and the job's messages grow as N, not N^2.

A record says what concerns every rank alike: the departed rank's collectives
on each of its groups, and which ranks it exchanged point-to-point messages
with (its *partners*): those get its point-to-point counts straight from it,
one message each, since only they can be waiting on them. A rank that is a
partner takes a departed rank's facts once that message is in; any other
rank knows from the record alone that the departed rank sent it nothing and
received nothing from it.

This module keeps the book (records known, what each neighbour has yet to be
sent) and the tree's shape; it holds no MPI, so that its logic is tested
without any. Where ranks died (fault-tolerant mode) the tree is walked through
them: a rank's neighbours are the nearest live ranks along the tree, and a
neighbour new to it is sent every record known, so that no news stops at a
dead rank. Fault-tolerant mode's survivors pass on where each stopped in the
same book, over a tree of a group's ranks
(:mod:`hpccomm.fault_tolerance.stop_points`).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from typing import Generic, TypeVar

#: Children a rank has in the tree: 4 keeps every rank within 7 hops of the root at 16,384 ranks (so any two
#: within 14), with at most 5 neighbours a rank.
FANOUT = 4

#: A record's partners are listed up to this many ranks; a rank that exchanged messages with more sends its
#: point-to-point counts to every rank (as every goodbye did before the tree) and its record says so (None).
MOST_PARTNERS = 64

#: What a departure says to every rank: its word (leaving, or failing and asking for flight records), the
#: collectives it posted and promised on each of its groups (by group key, :meth:`hpccomm.ledger.Ledger.key`),
#: and the ranks of ``MPI_COMM_WORLD`` it exchanged point-to-point messages with (None: more than MOST_PARTNERS,
#: and every rank gets its counts).
Record = tuple[bytes, dict[str, int], "tuple[int, ...] | None"]

#: What the book carries about one rank: a departure's :data:`Record`, or (fault-tolerant mode's stops,
#: :mod:`hpccomm.fault_tolerance.stop_points`) the number of the operation a survivor stopped at.
News = TypeVar("News")


def tree_neighbours(position: int, size: int, fanout: int = FANOUT) -> list[int]:
    """The positions next to ``position`` in a ``fanout``-ary tree over positions 0 to ``size - 1`` (0 the root)."""
    neighbours = [(position - 1) // fanout] if position > 0 else []
    first = position * fanout + 1
    neighbours.extend(range(first, min(first + fanout, size)))
    return neighbours


def live_neighbours(position: int, size: int, dead: Collection[int], fanout: int = FANOUT) -> list[int]:
    """The nearest positions along the tree from ``position`` that are not ``dead``, walking through dead ones."""
    seen = {position}
    waiting = tree_neighbours(position, size, fanout)
    live = []
    while waiting:
        near = waiting.pop()
        if near in seen:
            continue
        seen.add(near)
        if near in dead:
            waiting.extend(tree_neighbours(near, size, fanout))
        else:
            live.append(near)
    return sorted(live)


def facts_from(record: Record) -> dict[str, tuple[int, int, int]]:
    """A departed rank's facts for a rank that is not its partner: its collectives, no point-to-point message."""
    return {key: (collectives, 0, 0) for key, collectives in record[1].items()}


def is_partner(record: Record, rank: int) -> bool:
    """Whether the departed rank sends ``rank`` its point-to-point counts in a message of their own."""
    partners = record[2]
    return partners is None or rank in partners


class NewsBook(Generic[News]):
    """The news this rank knows of, a piece per rank, and what it still has to pass on to each tree neighbour.

    The news of departures (:data:`Record`), or of fault-tolerant mode's stops.

    Args:
        me: this rank, as a rank of ``MPI_COMM_WORLD`` (the numbering records travel in).
        world: the ``MPI_COMM_WORLD`` rank of each world rank, in world order: the tree's positions.
        fanout: children a rank has in the tree.

    Attributes:
        records: each departed rank's record, by ``MPI_COMM_WORLD`` rank (this rank's own once it leaves).
            For stops, the ranks are those of the group, and so is ``world``.
    """

    def __init__(self, me: int, world: Sequence[int], fanout: int = FANOUT) -> None:
        self.records: dict[int, News] = {}
        self._awaited: set[int] = set()  # the other world ranks whose news has not come: what everyone_left reads
        self._fanout = fanout
        self._outbox: dict[int, list[tuple[int, News]]] = {}
        self._neighbours: list[int] = []
        self.reshape(me, world, set())

    def reshape(self, me: int, world: Sequence[int], dead: Collection[int]) -> list[int]:
        """Take the world as it now is (after a shrink or a repair) and the ranks known dead; the new neighbours.

        A neighbour this rank did not have is owed every record known.
        """
        self._me = me
        self._world = tuple(world)
        self._awaited = {rank for rank in self._world if rank != me and rank not in self.records}
        position = {rank: index for index, rank in enumerate(self._world)}
        dead_positions = {position[rank] for rank in dead if rank in position}
        if me in position:
            near = live_neighbours(position[me], len(self._world), dead_positions, self._fanout)
            neighbours = [self._world[index] for index in near]
        else:
            neighbours = []  # not a rank of the world (a spare): it neither hears nor passes on news
        new = [rank for rank in neighbours if rank not in self._neighbours]
        self._neighbours = neighbours
        self._outbox = {rank: self._outbox.get(rank, []) for rank in neighbours}
        for rank in new:
            self._outbox[rank] = list(self.records.items())
        return new

    @property
    def neighbours(self) -> list[int]:
        """This rank's neighbours in the tree, as ranks of ``MPI_COMM_WORLD``."""
        return list(self._neighbours)

    def learn(self, news: Iterable[tuple[int, News]], source: int | None) -> list[tuple[int, News]]:
        """Take in records that came from ``source`` (None: this rank's own); the ones new to this rank.

        Each new record is owed to every neighbour but ``source``.
        """
        new = []
        for rank, record in news:
            if rank in self.records:
                continue
            self.records[rank] = record
            self._awaited.discard(rank)
            new.append((rank, record))
        if new:
            for neighbour, owed in self._outbox.items():
                if neighbour != source:
                    owed.extend(new)
        return new

    def outbox(self) -> dict[int, tuple[tuple[int, News], ...]]:
        """What each neighbour is owed, as one batch each; emptied."""
        batches = {neighbour: tuple(owed) for neighbour, owed in self._outbox.items() if owed}
        for neighbour in batches:
            self._outbox[neighbour] = []
        return batches

    def owes(self) -> bool:
        """Whether some neighbour is owed news."""
        return any(self._outbox.values())

    def everyone_left(self, dead: Collection[int] = ()) -> bool:
        """Whether every other world rank has left (its record is here) or is ``dead``.

        Reads only the ranks still awaited: a rank lingering at exit asks every few milliseconds, and reading the
        whole world each time cost 1.2 ms at 16,384 ranks.
        """
        return all(rank in dead for rank in self._awaited)
