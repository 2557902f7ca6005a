"""The facts a goodbye carries and the verdicts drawn from them (hpccomm/ledger.py), in one process.

The same logic across real departures: tests/test_failures.py (a rank that left after its part, a receive
its departed sender left unsent, the exits that end a job).
"""

import pytest
from hpccomm import ledger
from hpccomm.ledger import Ledger, did_part


@pytest.fixture(autouse=True)
def fresh_registry(monkeypatch):
    monkeypatch.setattr(ledger, "_ledgers", [])


def test_a_departed_rank_did_its_part_in_the_collectives_it_posted():
    book = Ledger("0", [0, 1, 2], [0, 1, 2])
    for _ in range(3):
        book.post("all_reduce", -1)
    facts = book.facts_for(1)
    assert did_part(facts, "all_reduce", -1, 1)
    assert did_part(facts, "all_reduce", -1, 2)
    assert did_part(facts, "barrier", -1, 3)
    assert not did_part(facts, "all_reduce", -1, 4)  # never posted: the survivor's 4th waits in vain


def test_messages_are_matched_by_their_count_per_peer_and_direction():
    book = Ledger("0", [0, 1, 2], [10, 11, 12])
    book.post("send", 1)
    book.post("send", 1)
    book.post("send", 2)
    book.post("recv", 1)
    to_1, to_2 = book.facts_for(1), book.facts_for(2)
    # Told ranks look from their side: their receive #n needs the departed rank's send #n to them.
    assert did_part(to_1, "recv", 0, 1) and did_part(to_1, "recv", 0, 2) and not did_part(to_1, "recv", 0, 3)
    assert did_part(to_2, "recv", 0, 1) and not did_part(to_2, "recv", 0, 2)
    assert did_part(to_1, "send", 0, 1) and not did_part(to_1, "send", 0, 2)
    assert not did_part(to_2, "send", 0, 1)
    assert did_part(to_2, "recv", None, 5)  # from any source: another rank may send
    assert book.post("recv", None) == 0


def test_a_goodbye_names_the_groups_it_shares_with_the_told_rank_newest_first_and_at_most_a_few():
    world = Ledger("0", [0, 1, 2, 3], [0, 1, 2, 3])
    pair = Ledger("1", [2, 3], [2, 3])
    assert set(ledger.facts_for(1)) == {world.key()}
    assert list(ledger.facts_for(3)) == [pair.key(), world.key()]
    for i in range(ledger.MOST_GROUPS + 5):
        Ledger(f"g{i}", [0, 1], [0, 1])
    told = ledger.facts_for(1)
    assert len(told) == ledger.MOST_GROUPS and world.key() not in told  # the oldest left out: not done there
    assert not did_part(told.get(world.key()), "all_reduce", -1, 1)


def test_a_goodbye_names_the_groups_used_last_however_many_were_made_after_them():
    # The world is made first and waited on to the end; ordered by when groups were made, as until 2026-12-06,
    # it fell out of goodbyes once MOST_GROUPS groups came after it, and a rank that left after its part of a
    # world collective read as one that had not.
    world = Ledger("0", [0, 1], [0, 1])
    world.post("all_reduce", -1)
    later = [Ledger(f"g{i}", [0, 1], [0, 1]) for i in range(ledger.MOST_GROUPS + 5)]
    assert world.key() not in ledger.facts_for(1)  # made, and used, before all of them
    world.post("all_reduce", -1)
    told, counts = ledger.facts_for(1), ledger.collective_counts()
    assert list(told)[0] == list(counts)[0] == world.key(), list(told)[:2]
    assert did_part(told[world.key()], "all_reduce", -1, 2) and counts[world.key()] == 2
    assert later[0].key() not in told and later[-1].key() in told  # the one used longest ago made way
    later[0].post("send", 1)  # a message is use too
    assert list(ledger.facts_for(1))[:2] == [later[0].key(), world.key()]
    promised = later[1]
    promised.promised = 1  # a collective promised comes first, however long unused
    assert list(ledger.facts_for(1))[:2] == [promised.key(), later[0].key()]


def test_a_key_tells_apart_groups_of_one_name_by_members_and_by_order_and_is_fixed_once_named():
    first = Ledger("0", [0, 1, 2], [0, 1, 2])
    repaired = Ledger("0", [0, 1, 2], [0, 3, 2])  # a spare, MPI rank 3, replaced rank 1
    again = Ledger("0", [0, 1, 2], [0, 1, 2])  # destroy_process_group, then init again
    keys = {first.key(), repaired.key(), again.key()}
    assert len(keys) == 3
    unnamed = Ledger("", [0, 1], [0, 1])
    before = unnamed.key()
    unnamed.name = "7"
    assert unnamed.key() != before and unnamed.key().startswith("7:")
    Ledger("7", [0, 1], [0, 1])
    assert unnamed.key().endswith("#0")


def test_promised_collectives_count_as_done():
    book = Ledger("ucc-context", [0, 1], [0, 1])
    book.post("bootstrap", -1)
    book.promised = 1  # the teardown's barrier, after the goodbye
    assert did_part(book.facts_for(1), "bootstrap", -1, 2)
    assert not did_part(book.facts_for(1), "bootstrap", -1, 3)


def test_a_group_with_a_collective_promised_is_named_in_every_goodbye_however_many_groups_came_after():
    # UCC's context, made with the first UCC group, promises its teardown barrier just before the goodbye;
    # every later UCC group's bootstrap keeps a ledger of its own. Left out as the oldest once more than
    # MOST_GROUPS came after, it read as a rank that would not take part, and the other ranks' teardown gave
    # up on it (then MPI wrote the late barrier into memory UCC had freed: a crash at exit).
    context = Ledger("ucc-context", [0, 1], [0, 1])
    context.post("bootstrap", -1)
    for i in range(ledger.MOST_GROUPS + 5):
        Ledger("ucc-team", [0, 1], [0, 1]).post("bootstrap", -1)
    assert context.key() not in ledger.facts_for(1) and context.key() not in ledger.collective_counts()
    context.promised = 1
    told, counts = ledger.facts_for(1), ledger.collective_counts()
    assert len(told) == len(counts) == ledger.MOST_GROUPS
    assert list(told)[0] == list(counts)[0] == context.key(), list(told)[:2]
    assert did_part(told[context.key()], "bootstrap", -1, 2) and counts[context.key()] == 2
    newest = Ledger("ucc-team", [0, 1], [0, 1])  # then the newest, as before
    assert list(ledger.facts_for(1))[:2] == [context.key(), newest.key()]


class CountingFacts(dict):
    """A departed rank's facts that count how often a verdict reads them."""

    reads = 0

    def get(self, *args):
        CountingFacts.reads += 1
        return super().get(*args)


def fresh_verdict(departed, book, op, peer, ticket):
    """Every departed member read afresh: what a check did before departures kept each group's verdict."""
    if peer is None:
        return []
    position = book.position()
    members = [book.mpi_ranks[peer]] if peer != -1 else list(position)
    return sorted(book.world_ranks[position[r]] for r in members
                  if r in departed and not did_part(departed.get(r).get(book.key()), op, peer, ticket))


def test_departures_give_every_check_the_verdict_of_reading_every_departure_afresh():
    import random
    rng = random.Random(41)
    world = Ledger("0", range(12), range(12))
    odd = Ledger("1", range(6), [1, 3, 5, 7, 9, 11])
    departed = ledger.Departures()
    for mpi_rank in rng.sample(range(1, 12), 11):
        facts = {world.key(): (rng.randint(0, 6), 0, 0)}
        if mpi_rank % 2:
            facts[odd.key()] = (rng.randint(0, 6), rng.randint(0, 3), rng.randint(0, 3))
        if rng.random() < 0.2:
            facts.pop(world.key())  # its goodbye left the group out: not done there
        departed.add(mpi_rank, facts)
        departed.add(mpi_rank, {})  # a second word from the same rank changes nothing
        for _ in range(5):
            book = rng.choice([world, odd])
            op, peer = rng.choice([("all_reduce", -1), ("send", rng.randrange(len(book.mpi_ranks))),
                                   ("recv", rng.randrange(len(book.mpi_ranks))), ("recv", None)])
            ticket = rng.randint(1, 7)
            assert departed.abandoned(book, op, peer, ticket) == fresh_verdict(departed, book, op, peer, ticket)
    assert len(departed) == 11 and 0 not in departed and 5 in departed


def test_a_check_reads_only_the_departures_learnt_since_the_group_was_last_checked():
    world = Ledger("0", range(1000), range(1000))
    ticket = world.post("all_reduce", -1)
    departed = ledger.Departures()
    for mpi_rank in range(1, 1000):
        departed.add(mpi_rank, CountingFacts({world.key(): (ticket, 0, 0)}))
    CountingFacts.reads = 0
    assert departed.abandoned(world, "all_reduce", -1, ticket) == []
    assert CountingFacts.reads == 999
    for _ in range(100):  # a slow rank's checks while the collective's data is on its way
        assert departed.abandoned(world, "all_reduce", -1, ticket) == []
    assert CountingFacts.reads == 999
    departed.add(0, CountingFacts({world.key(): (ticket - 1, 0, 0)}))  # one that left without its part
    assert departed.abandoned(world, "all_reduce", -1, ticket) == [0]
    assert departed.abandoned(world, "all_reduce", -1, ticket - 1) == []


def test_a_group_named_after_its_first_check_is_judged_by_its_new_key():
    unnamed = Ledger("", [0, 1, 2], [0, 1, 2])
    departed = ledger.Departures()
    departed.add(1, {unnamed.key(): (5, 0, 0)})
    assert departed.abandoned(unnamed, "all_reduce", -1, 1) == []
    unnamed.name = "5"
    assert departed.abandoned(unnamed, "all_reduce", -1, 1) == [1]  # its facts name no group by the new key
