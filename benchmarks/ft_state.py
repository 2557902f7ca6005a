"""The state a replacement receives (``hpccomm.TrainingState``) against a plain broadcast of the same bytes.

    hpccomm-run -n 4 python benchmarks/ft_state.py [--params 25000000] [--repeats 5] [--fresh]

A model of ``--params`` float32 parameters (square Linear layers) with an
SGD-with-momentum optimizer, so the state is twice the parameters' bytes.
Rank 0 sends its state to every other rank (``TrainingState.send_state``,
what ``resume`` does for a replacement: a pickled skeleton, then one
broadcast per dtype of the tensors' bytes), timed from the first rank in to
the last rank out; then a single ``dist.broadcast`` of a tensor of the same
bytes, the floor. Rank 0 prints one ``RESULT {json}`` line: the medians and
the ratio.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import hpccomm
import torch
import torch.distributed as dist


def timed(action) -> float:
    """Seconds from the first rank's start to the last rank's end (a barrier before, the slowest rank after)."""
    dist.barrier()
    start = time.perf_counter()
    action()
    took = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
    dist.all_reduce(took, op=dist.ReduceOp.MAX)
    return float(took)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=int, default=25_000_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--fresh", action="store_true",
                        help="the receivers' optimizers have no state yet, as a replacement's: their buffers are made")
    args = parser.parse_args()
    width = 2048
    layers = max(1, round(args.params / (width * width + width)))
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    dist.init_process_group("hpccomm")
    if not args.fresh or dist.get_rank() == 0:
        for p in model.parameters():
            optimizer.state[p]["momentum_buffer"] = torch.randn_like(p)  # as after a first step
    state = hpccomm.TrainingState(model=model, optimizer=optimizer)
    params = sum(p.numel() for p in model.parameters())
    nbytes = 2 * params * 4
    plain = torch.ones(nbytes // 4, dtype=torch.float32)  # written: a never-touched buffer reads as the zero page
    def send() -> None:
        if args.fresh and dist.get_rank() != 0:
            optimizer.state.clear()  # each time, as a new replacement's
        state.send_state(0)

    transfer = [timed(send) for _ in range(args.repeats)]
    floor = [timed(lambda: dist.broadcast(plain, src=0)) for _ in range(args.repeats)]
    if dist.get_rank() == 0:
        result = {
            "ranks": dist.get_world_size(), "params": params, "bytes": nbytes, "fresh": args.fresh,
            "transfer_s": round(statistics.median(transfer), 4), "broadcast_s": round(statistics.median(floor), 4),
            "ratio": round(statistics.median(transfer) / statistics.median(floor), 3),
            "transfer_all_s": [round(t, 4) for t in transfer], "broadcast_all_s": [round(t, 4) for t in floor],
        }
        print("RESULT " + json.dumps(result), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
