"""Run a random program of collectives (JSON in argv[1]); report each op's outcome.

Every op's inputs are a function of (rank, seed), so each rank computes the
expected result locally. An op either gives that result ("ok") or raises a
clear error ("error <type>"); the pytest side checks all ranks agree.
"""

from __future__ import annotations

import fast_exit  # noqa: F401  (first: its gc.freeze is the last exit handler; see that module)
import json
import sys

import hpccomm  # noqa: F401
import torch
import torch.distributed as dist
from expected import ALL, Op, combine, torch_op, valid_ops, value
from rankcheck import say

OPS = {"sum": Op.SUM, "product": Op.PRODUCT, "min": Op.MIN, "max": Op.MAX, "avg": Op.AVG,
       "band": Op.BAND, "bor": Op.BOR, "bxor": Op.BXOR, "premul": "premul"}

program = json.loads(sys.argv[1])
dist.init_process_group("hpccomm")
rank, size = dist.get_rank(), dist.get_world_size()


def run_op(spec: dict) -> None:
    dtype = ALL[spec["dtype"]]
    op = OPS[spec["op"]]
    n, root, seed = spec["numel"], spec["root"], spec["seed"]
    mine = lambda r: value(r + seed, dtype, n, op == Op.PRODUCT)  # noqa: E731
    kind = spec["kind"]
    if kind == "all_reduce":
        t = mine(rank).clone()
        dist.all_reduce(t, op=torch_op(op))
        assert torch.equal(t, combine(op, dtype, [mine(r) for r in range(size)])), "all_reduce result"
    elif kind == "reduce":
        t = mine(rank).clone()
        dist.reduce(t, dst=root, op=torch_op(op))
        if rank == root:
            assert torch.equal(t, combine(op, dtype, [mine(r) for r in range(size)])), "reduce result"
    elif kind == "broadcast":
        t = mine(rank).clone()
        dist.broadcast(t, src=root)
        assert torch.equal(t, mine(root)), "broadcast result"
    elif kind == "all_gather":
        out = torch.empty(size * n, dtype=dtype)
        dist.all_gather_into_tensor(out, mine(rank))
        assert torch.equal(out, torch.cat([mine(r) for r in range(size)])), "all_gather result"
    elif kind == "reduce_scatter":
        big = lambda r: value(r + seed, dtype, n * size, op == Op.PRODUCT)  # noqa: E731
        out = torch.empty(n, dtype=dtype)
        dist.reduce_scatter_tensor(out, big(rank), op=torch_op(op))
        want = combine(op, dtype, [big(r)[rank * n : (rank + 1) * n] for r in range(size)])
        assert torch.equal(out, want), "reduce_scatter result"
    elif kind == "all_to_all":
        ins = torch.cat([value(100 * rank + j + seed, dtype, n) for j in range(size)])
        out = torch.empty(size * n, dtype=dtype)
        dist.all_to_all_single(out, ins)
        assert torch.equal(out, torch.cat([value(100 * r + rank + seed, dtype, n) for r in range(size)])), "a2a"
    elif kind == "gather":
        outs = [torch.empty(n, dtype=dtype) for _ in range(size)] if rank == root else None
        dist.gather(mine(rank), outs, dst=root)
        if rank == root:
            assert all(torch.equal(outs[r], mine(r)) for r in range(size)), "gather result"


for i, spec in enumerate(program):
    try:
        run_op(spec)
        outcome = "ok"
    except AssertionError:
        raise  # a wrong result is a failure, never an acceptable outcome
    except (ValueError, RuntimeError) as exc:
        outcome = f"error {type(exc).__name__}"
        if spec["op"] not in ("premul",) and spec["kind"] in ("all_reduce", "reduce", "reduce_scatter"):
            dtype = ALL[spec["dtype"]]
            if OPS[spec["op"]] in valid_ops(dtype) and 0 <= spec["root"] < size:
                raise AssertionError(f"valid op {spec} raised {exc!r}") from exc
    say(f"OP rank={rank} i={i} {outcome}")
dist.destroy_process_group()
say(f"DONE rank={rank}")
