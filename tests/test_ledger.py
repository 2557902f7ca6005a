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
