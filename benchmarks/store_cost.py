"""What the job's store costs: init time and store operations, served over MPI against torch's TCPStore.

    python benchmarks/store_cost.py [--ranks 2,4,8,16,32] [--ops 10000] [--repeats 3] [--stores mpi,tcp,file]

Every job runs on two fake nodes of this machine (tests/nodes.py: root,
unshare), half the ranks on each, under the MPI wheel's own launcher; the
store is chosen with ``HPCCOMM_STORE`` (``mpi``: hpccomm/store.py; ``tcp``:
torch's TCPStore on rank 0, the rendezvous of hpccomm before it; ``file``:
the one-node FileStore, measured here only for its store operations, by one
node of 2 ranks). Init time: ``init_process_group("hpccomm")`` and a first
barrier, after MPI has started (the same for every store), the slowest rank,
median of ``--repeats`` jobs. Operations: ``--ops`` sets, gets and adds of
64-byte values one after the other, by rank 0 (the store's own process) and
by the last rank (on the other node), microseconds an operation, median of the
repeats. Compute: rank 0 of 2 runs a pure-Python loop (best of 5) while the
store idles, which shows what the server's thread takes from rank 0's Python
(it wakes to look for operations, and needs the GIL to). Prints three tables.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from nodes import run_on_nodes  # noqa: E402


def job(per_node: tuple[int, ...], store: str, *args: str) -> str:
    """The job's output; a failed job's output is printed (its last lines) and empty output returned."""
    run = run_on_nodes(per_node, "store_cost.py", *args, env={"HPCCOMM_STORE": store}, limit_s=600)
    if run.returncode != 0 or run.timed_out:
        print(f"{store} {per_node} {args}: the job failed:\n{run.output[-1500:]}", file=sys.stderr, flush=True)
        return ""
    return run.output


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", default="2,4,8,16,32")
    parser.add_argument("--ops", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--stores", default="mpi,tcp,file")
    args = parser.parse_args()
    stores = args.stores.split(",")
    print("init_process_group + barrier, slowest rank, median s (min-max)")
    print("| ranks | " + " | ".join(s for s in stores if s != "file") + " |")
    for n in (int(part) for part in args.ranks.split(",")):
        times: dict[str, list[float]] = {store: [] for store in stores if store != "file"}
        for _ in range(args.repeats):
            for store in times:  # in turn, so that a slow spell of the machine falls on every store
                found = re.findall(r"INIT rank=\d+ s=([0-9.]+)", job((n - n // 2, n // 2), store, "init"))
                if len(found) == n:
                    times[store].append(max(float(t) for t in found))
        cells = []
        for store, taken in times.items():
            cell = f"{statistics.median(taken):.3f} ({min(taken):.3f}-{max(taken):.3f})" if taken else "-"
            failed = args.repeats - len(taken)
            cells.append(cell + (f", {failed} of {args.repeats} jobs failed" if failed else ""))
        print(f"| {n} | " + " | ".join(cells) + " |", flush=True)
    print(f"\n{args.ops} operations each, 64-byte values, us an operation, median of {args.repeats} jobs")
    print("| store | op | rank 0 (serving process) | other rank |")
    for store in stores:
        per_node = (2,) if store == "file" else (1, 1)
        found: dict[tuple[str, int], list[float]] = {}
        for _ in range(args.repeats):
            output = job(per_node, store, "ops", str(args.ops))
            for rank, op, us in re.findall(r"OPS rank=(\d+) op=(\w+) us=([0-9.]+)", output):
                found.setdefault((op, int(rank)), []).append(float(us))
        for op in ("set", "get", "add"):
            print(f"| {store} | {op} | {statistics.median(found[op, 0]):.1f} | {statistics.median(found[op, 1]):.1f} |",
                  flush=True)
    print(f"\nrank 0's pure-Python loop while the store idles, s (median of {args.repeats} jobs, each the best of 5)")
    print("| store | s |")
    for store in stores:
        per_node = (2,) if store == "file" else (1, 1)
        times = [float(re.search(r"COMPUTE s=([0-9.]+)", job(per_node, store, "compute"))[1])
                 for _ in range(args.repeats)]
        print(f"| {store} | {statistics.median(times):.4f} ({min(times):.4f}-{max(times):.4f}) |", flush=True)


if __name__ == "__main__":
    main()
