"""What a rank did on each of its groups: the facts its goodbye gives, and the verdicts drawn from them.

A rank that leaves the job tells the others what it did (:mod:`hpccomm.failure`),
so that a rank still waiting on an operation can tell a departed peer that did
its part, whose data is on its way however late it lands, from one that left
without doing it, whose absence dooms the operation. Each group keeps a
:class:`Ledger`: the collectives it posted (the n-th collective of a group is
the same operation on every member) and the point-to-point messages it posted
to and from each peer (the n-th message from A to B is matched by B's n-th
receive from A). Posting is taking part: an operation the rank posted and saw
fail (its timeout) failed for another rank's absence. Every operation is
stamped with its number, its *ticket*, as it is posted.

A goodbye carries, for each group the departed and the told rank share, only
what concerns the told rank (:func:`facts_for`): a few integers a group, the
same size at 4 ranks as at 4,096. Where goodbyes travel a tree of the ranks
(:mod:`hpccomm.goodbye_tree`), a departure's record says what concerns every
rank alike (:func:`collective_counts`, :func:`partners`), and only the
partners get their point-to-point counts. A rank keeps what departed ranks
said in :class:`Departures`, which draws each group's verdicts from it. This
module holds no MPI and imports nothing of hpccomm: the groups
(:mod:`hpccomm.front`) and UCC's bootstrap (:mod:`hpccomm.transports.ucc`)
keep ledgers, and :mod:`hpccomm.failure` carries their facts.
"""

from __future__ import annotations

import itertools
import zlib
from collections.abc import Sequence

#: A goodbye names at most this many groups, those last used first (after any with a collective promised: see
#: :func:`_told`): goodbyes stay small enough for MPI's eager protocol (a few KiB), so their sends complete
#: whether or not the other rank is still there to match them. A departed rank whose goodbye left out a group
#: counts as not having done its part on it.
MOST_GROUPS = 64

#: The process's clock of ledger use: each call a number greater than every earlier one (:attr:`Ledger.used`).
#: A C call that holds the GIL throughout: threads that post at once get different numbers.
tick = itertools.count(1).__next__

#: What a goodbye says of one group to one rank: (collectives posted and promised, messages posted to the told
#: rank, receives posted from it).
Facts = tuple[int, int, int]

#: Every ledger this process made, in the order made (which is the same on every member of a group).
_ledgers: list["Ledger"] = []


class Ledger:
    """One group's record of the operations this rank posted on it.

    Args:
        name: the group's name, the same on every member (torch's group
            name); it may be set later, before the group's first operation.
        world_ranks: the world rank of each group rank (for messages).
        mpi_ranks: the ``MPI_COMM_WORLD`` rank of each group rank, the
            numbering goodbyes travel in.

    Attributes:
        collectives: collectives posted so far; the last one's ticket.
        promised: collectives this rank will still post after its goodbye
            (UCC's teardown barrier, run after the goodbye is out).
        used: when the group was last used, made or posted on (:data:`tick`).
    """

    __slots__ = ("name", "world_ranks", "mpi_ranks", "collectives", "promised", "sent", "received", "used",
                 "_key", "_position")

    def __init__(self, name: str, world_ranks: Sequence[int], mpi_ranks: Sequence[int]) -> None:
        self.name = name
        self.world_ranks = tuple(world_ranks)
        self.mpi_ranks = tuple(mpi_ranks)
        self.collectives = 0
        self.promised = 0
        self.sent: dict[int, int] = {}
        self.received: dict[int, int] = {}
        self.used = tick()
        self._key = ""
        self._position: dict[int, int] | None = None
        _ledgers.append(self)

    def post(self, op: str, peer: int | None) -> int:
        """Count an operation as posted; its ticket.

        Args:
            op: its name ("send" and "recv" for point-to-point).
            peer: the group rank of a point-to-point op's peer; None for a
                receive from any source (ticket 0: no departure dooms it);
                -1 for a collective.
        """
        self.used = tick()
        if peer == -1:
            self.collectives += 1
            return self.collectives
        if peer is None:
            return 0
        counts = self.sent if op == "send" else self.received
        counts[peer] = ticket = counts.get(peer, 0) + 1
        return ticket

    def key(self) -> str:
        """Equal on every member of the group, and on no other group of theirs.

        The group's name, its members (a spare that replaced a dead rank makes
        the repaired group with the survivors, under the old group's name) and
        how many groups of both this process made before it (a group made again
        after ``destroy_process_group``).
        """
        if self._key:
            return self._key
        earlier = sum(1 for ledger in _ledgers[:_ledgers.index(self)]
                      if ledger.name == self.name and ledger.mpi_ranks == self.mpi_ranks)
        key = f"{self.name}:{zlib.crc32(repr(self.mpi_ranks).encode()):08x}#{earlier}"
        if self.name:  # fixed once named: groups made later do not change it
            self._key = key
        return key

    def position(self) -> dict[int, int]:
        """Group rank by ``MPI_COMM_WORLD`` rank."""
        if self._position is None:
            self._position = {mpi_rank: rank for rank, mpi_rank in enumerate(self.mpi_ranks)}
        return self._position

    def facts_for(self, rank: int) -> Facts:
        """What this ledger tells the member of group rank ``rank``."""
        return self.collectives + self.promised, self.sent.get(rank, 0), self.received.get(rank, 0)


def _told() -> list[Ledger]:
    """The ledgers in the order a goodbye names them: first those with a collective promised after it, then the
    last used first.

    A promised collective (UCC's teardown barrier over the process's UCC context, which was made with the first
    UCC group) is one the other ranks wait in after the goodbye has reached them: left out of it, as the oldest
    group was once more than MOST_GROUPS newer ones (every UCC group's bootstrap keeps a ledger) came after, it
    read as a rank that left without its part, and the others' teardown gave up on it. The others' waits are
    on the groups used last (the world's, a pipeline's stage): ordered by when they were made, as until
    2026-12-06, the world's fell out of a goodbye once 64 groups, or 32 on UCC, had been made after it.
    """
    return sorted(_ledgers, key=lambda ledger: (not ledger.promised, -ledger.used))


def facts_for(mpi_rank: int) -> dict[str, Facts]:
    """A goodbye's facts for the rank ``mpi_rank`` of ``MPI_COMM_WORLD``: one entry a group it shares, in
    :func:`_told`'s order."""
    facts: dict[str, Facts] = {}
    for ledger in _told():
        rank = ledger.position().get(mpi_rank)
        if rank is not None:
            facts[ledger.key()] = ledger.facts_for(rank)
            if len(facts) == MOST_GROUPS:
                break
    return facts


def collective_counts() -> dict[str, int]:
    """The collectives posted and promised on each group, by group key, in :func:`_told`'s order (at most
    MOST_GROUPS)."""
    counts: dict[str, int] = {}
    for ledger in _told():
        counts.setdefault(ledger.key(), ledger.collectives + ledger.promised)
        if len(counts) == MOST_GROUPS:
            break
    return counts


def partners(most: int) -> tuple[int, ...] | None:
    """The ``MPI_COMM_WORLD`` ranks this rank posted point-to-point messages to or from; None if more than ``most``."""
    ranks: set[int] = set()
    for ledger in _ledgers:
        for peer in (*ledger.sent, *ledger.received):
            ranks.add(ledger.mpi_ranks[peer])
        if len(ranks) > most:
            return None
    return tuple(sorted(ranks))


def did_part(facts: Facts | None, op: str, peer: int | None, ticket: int) -> bool:
    """Whether a departed rank, by its goodbye's ``facts`` on a group, did its part in the operation with ``ticket``.

    ``op``, ``peer`` and ``ticket`` are the waiting rank's: its own receive is
    matched by the departed rank's send, and the other way round. A rank
    that posted the operation took part, also where it left it unfinished
    (its own timeout, an aborted group): the failure is then another rank's,
    and the waiting rank's own timeout reports it, as it did on that rank;
    naming the departed rank would blame the wrong one.
    """
    if facts is None:  # its goodbye does not name the group: it never made it, or the goodbye left it out
        return False
    if peer is None:
        return True  # a receive from any source: another rank may send
    posted = facts[0] if peer == -1 else facts[1] if op == "recv" else facts[2]
    return ticket <= posted


class Departures:
    """What each departed rank said, by ``MPI_COMM_WORLD`` rank, and the verdicts drawn from it for each group.

    A rank waiting on a collective asks, at every check, whether a departed
    member of its group left without posting it. Read afresh at each check,
    that is every departure of the job, again and again, just when a slow
    rank is the last in an operation that the others completed and left
    (about 31 ms a check after 16,382 departures; docs/scale.md). Here each group
    keeps the fewest collectives any of its departed members posted, brought
    up to date with the departures learnt since its last check: a check reads
    only those, and the whole list only to name the ranks of a verdict.
    """

    def __init__(self) -> None:
        self._facts: dict[int, dict[str, Facts]] = {}
        self._order: list[int] = []  # departed ranks in the order learnt; only appended to
        # By group: its key, the departures read so far, and the fewest collectives a departed member posted
        # (None: no member among them). Replaced whole, so threads that check at once each see a consistent one.
        self._groups: dict[Ledger, tuple[str, int, int | None]] = {}

    def add(self, mpi_rank: int, facts: dict[str, Facts]) -> None:
        """Take a departed rank's facts on each group it shares with this rank (only the first word counts)."""
        if mpi_rank not in self._facts:
            self._facts[mpi_rank] = facts
            self._order.append(mpi_rank)  # after the facts: a reader that sees the rank finds its facts

    def __contains__(self, mpi_rank: object) -> bool:
        return mpi_rank in self._facts

    def __len__(self) -> int:
        return len(self._order)

    def get(self, mpi_rank: int) -> dict[str, Facts] | None:
        """A departed rank's facts by group key; None if it has not left (or this rank has not learnt it yet)."""
        return self._facts.get(mpi_rank)

    def abandoned(self, book: Ledger, op: str, peer: int | None, ticket: int) -> list[int]:
        """The world ranks of ``book``'s group that left without doing their part in an operation (:func:`did_part`).

        Args:
            book: the ledger of the operation's group.
            op: the operation's name ("send" and "recv" are point-to-point).
            peer: the group rank a point-to-point operation waits for (None:
                any rank); -1 for a collective, which needs every member.
            ticket: the operation's ticket (:meth:`Ledger.post`).
        """
        if peer is None or not self._order:
            return []
        key = book.key()
        if peer != -1:
            facts = self._facts.get(book.mpi_ranks[peer])
            if facts is None or did_part(facts.get(key), op, peer, ticket):
                return []
            return [book.world_ranks[peer]]
        known, read, fewest = self._groups.get(book, (key, 0, None))
        if known != key:  # named since its last check: its facts go by the new key
            read, fewest = 0, None
        order, end, position = self._order, len(self._order), book.position()
        for mpi_rank in order[read:end]:
            if mpi_rank in position:
                facts = self._facts[mpi_rank].get(key)
                posted = 0 if facts is None else facts[0]  # a group its goodbye left out: not done there
                fewest = posted if fewest is None else min(fewest, posted)
        self._groups[book] = (key, end, fewest)
        if fewest is None or ticket <= fewest:
            return []
        return sorted(book.world_ranks[position[mpi_rank]] for mpi_rank in order[:end]
                      if mpi_rank in position and not did_part(self._facts[mpi_rank].get(key), op, -1, ticket))
