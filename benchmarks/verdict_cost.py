"""What one fail-fast check costs a rank still waiting on a collective once the others left (issue 41), in one process.

    python benchmarks/verdict_cost.py [--ranks 64,1024,4096,16384] [--checks 200]

At a job's end a slow rank can still be inside the last collective when every other rank has done its part and
left; each check it makes while that collective's data is on its way (every few hundred polls, then every nap;
hpccomm/work/waiting.py) asks whether a departed member left without its part. This times
:func:`hpccomm.failure.abandoned` for a group of N ranks (this one, and one late rank still at work) after N-2
departures that each did their part: the
median over 7 rounds of ``--checks`` checks, in CPU microseconds, with MPI replaced by a control communicator
that has nothing more to deliver (a check's probe is MPI's own cost, measured in docs/scale.md). Then one more
departure, the late rank leaving without its part, must be named. No MPI job: N sets the number of departures.
"""

from __future__ import annotations

import argparse
import statistics
import time

from hpccomm import failure, ledger


class NothingMore:
    """A control communicator with no goodbye left to deliver."""

    def Iprobe(self, source: int, tag: int) -> bool:  # noqa: N802 (mpi4py's name)
        return False


def check_us(n: int, checks: int) -> tuple[float, float, float]:
    """CPU us of: one check after n-2 departures that did their part; the first such check; the naming check."""
    book = ledger.Ledger("world", range(n), range(n))  # rank 0 is this one, n - 1 the late one
    ticket = book.post("all_reduce", -1)
    failure._said = ledger.Departures()
    for peer in range(1, n - 1):
        failure._said.add(peer, {book.key(): (ticket, 0, 0)})
    start = time.process_time()
    assert failure.abandoned(book, "all_reduce", -1, ticket) == []
    first = time.process_time() - start
    rounds = []
    for _ in range(7):
        start = time.process_time()
        for _ in range(checks):
            failure.abandoned(book, "all_reduce", -1, ticket)
        rounds.append((time.process_time() - start) / checks)
    failure._said.add(n - 1, {book.key(): (ticket - 1, 0, 0)})
    start = time.process_time()
    assert failure.abandoned(book, "all_reduce", -1, ticket) == [n - 1]
    naming = time.process_time() - start
    return statistics.median(rounds) * 1e6, first * 1e6, naming * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", default="64,1024,4096,16384")
    parser.add_argument("--checks", type=int, default=200)
    args = parser.parse_args()
    failure._control = NothingMore()
    check_us(3, 1)  # the first check in a process loads mpi4py (failure.mpi): not a check's cost
    print("| ranks | one check, us | the first check after the departures, us | the check that names the late one, us |")
    print("|---|---|---|---|")
    for n in (int(value) for value in args.ranks.split(",")):
        each, first, naming = check_us(n, args.checks)
        print(f"| {n} | {each:.1f} | {first:.0f} | {naming:.0f} |")
        ledger._ledgers.clear()


if __name__ == "__main__":
    main()
