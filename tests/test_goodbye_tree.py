"""The departure tree's shape and its book: every live rank hears every departure, each record once a link.

hpccomm/goodbye_tree.py holds no MPI; here its books exchange batches in a simulated job, in random order, with
dead ranks that neither receive nor pass on. The same logic over real MPI: tests/test_failures.py (``tree``).
"""

import random

import pytest
from hpccomm.goodbye_tree import FANOUT, NewsBook, facts_from, is_partner, live_neighbours, tree_neighbours
from hypothesis import given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.one_environment  # hpccomm's own logic, no MPI: once in CI


@pytest.mark.parametrize("size", [1, 2, 5, 6, 21, 100, 4096])
def test_the_tree_is_a_tree(size):
    """Links go both ways, every rank is reached from rank 0, and N - 1 links: no cycle."""
    links = set()
    for rank in range(size):
        near = tree_neighbours(rank, size)
        assert len(near) <= FANOUT + 1
        for other in near:
            assert rank in tree_neighbours(other, size)
            links.add(frozenset((rank, other)))
    assert len(links) == size - 1
    seen, waiting = {0}, [0]
    while waiting:
        for other in tree_neighbours(waiting.pop(), size):
            if other not in seen:
                seen.add(other)
                waiting.append(other)
    assert seen == set(range(size))


def test_a_path_at_16384_ranks_is_at_most_7_hops_to_the_root():
    rank, hops = 16383, 0
    while rank:
        rank, hops = (rank - 1) // FANOUT, hops + 1
    assert hops <= 7


def test_live_neighbours_walk_through_the_dead():
    # 0's children are 1-4; 1's are 5-8. With 1 dead, 0 and 5-8 become neighbours of each other.
    assert live_neighbours(0, 9, dead={1}) == [2, 3, 4, 5, 6, 7, 8]
    assert live_neighbours(5, 9, dead={1}) == [0, 6, 7, 8]
    assert live_neighbours(5, 9, dead={1, 0}) == [2, 3, 4, 6, 7, 8]
    assert live_neighbours(3, 4, dead={0, 1, 2}) == []


def _simulate(size: int, world: list[int], dead: set[int], leaving: list[int], seed: int):
    """Books of every live rank exchange batches in random order; the books and the messages sent per rank.

    A rank passes news on when it next looks (a flush of its outbox), which may come after later batches.
    """
    rng = random.Random(seed)
    books = {rank: NewsBook(rank, world) for rank in world if rank not in dead}
    for rank, book in books.items():
        book.reshape(rank, world, dead)
    sent = dict.fromkeys(books, 0)
    in_flight: list = []
    departures = list(leaving)
    rng.shuffle(departures)
    dirty: set[int] = set()
    while departures or in_flight or dirty:
        choice = rng.random()
        if departures and choice < 0.2:
            rank = departures.pop()
            books[rank].learn([(rank, (b"\x01", {"g": 3}, ()))], None)
            dirty.add(rank)
        elif dirty and (choice < 0.5 or not in_flight):
            rank = rng.choice(sorted(dirty))
            dirty.discard(rank)
            for neighbour, batch in books[rank].outbox().items():
                sent[rank] += 1
                in_flight.append((neighbour, rank, batch))
        elif in_flight:
            neighbour, source, batch = in_flight.pop(rng.randrange(len(in_flight)))
            assert neighbour not in dead, "a batch was sent to a dead rank"
            if books[neighbour].learn(batch, source):
                dirty.add(neighbour)
    return books, sent


@settings(max_examples=60, deadline=None)
@given(size=st.integers(2, 80), seed=st.integers(0, 10**6), dead_share=st.sampled_from([0.0, 0.1, 0.3]))
def test_every_live_rank_hears_every_departure(size, seed, dead_share):
    rng = random.Random(seed)
    world = rng.sample(range(size * 2), size)  # world ranks travel as MPI_COMM_WORLD ranks, in any order
    dead = {rank for rank in world if rng.random() < dead_share}
    if len(dead) == size:
        dead.pop()
    live = [rank for rank in world if rank not in dead]
    books, sent = _simulate(size, world, dead, leaving=live, seed=seed)
    for rank, book in books.items():
        assert set(book.records) == set(live), (rank, sorted(book.records), live)
        assert book.everyone_left(dead)
    if not dead:  # a tree: each record crosses each link once, in batches; a leaf sends only its own
        assert sum(sent.values()) <= size * (size - 1)
        for rank, book in books.items():
            assert sent[rank] <= len(book.neighbours) * size


def test_a_neighbour_new_after_a_death_is_owed_every_record():
    world = list(range(9))
    book = NewsBook(0, world)
    book.learn([(3, (b"\x01", {}, ())), (2, (b"\x01", {}, ()))], source=3)
    assert book.owes()
    book.outbox()
    assert not book.owes()
    assert book.reshape(0, world, dead={1}) == [5, 6, 7, 8]
    assert book.owes()
    owed = book.outbox()
    assert sorted(owed) == [5, 6, 7, 8] and all(sorted(rank for rank, _ in batch) == [2, 3] for batch in owed.values())
    assert not book.owes()


def test_a_record_tells_non_partners_their_counts_and_partners_to_wait():
    record = (b"\x01", {"g:1#0": 5}, (2, 7))
    assert is_partner(record, 7) and not is_partner(record, 3)
    assert facts_from(record) == {"g:1#0": (5, 0, 0)}
    assert is_partner((b"\x01", {}, None), 3)  # too many partners to list: every rank gets its counts


def test_everyone_left_counts_the_dead_and_not_this_rank():
    book = NewsBook(4, [4, 9, 11])
    assert not book.everyone_left()
    book.learn([(9, (b"\x01", {}, ()))], source=9)
    assert not book.everyone_left() and book.everyone_left(dead={11})


def test_everyone_left_awaits_only_the_world_as_it_now_is():
    book = NewsBook(0, range(6))
    book.learn([(1, (b"\x01", {}, ())), (2, (b"\x01", {}, ()))], source=1)
    book.reshape(0, [0, 1, 2, 3, 4], dead=())  # a shrink: rank 5 is no longer in the world
    assert not book.everyone_left()
    book.learn([(3, (b"\x01", {}, ()))], source=1)
    assert not book.everyone_left() and book.everyone_left(dead={4})
    book.learn([(4, (b"\x01", {}, ()))], source=1)
    assert book.everyone_left()
