"""Smoke workload for the hpccomm Slurm templates: proves a job really runs as one MPI world.

Run it through any template in this directory, e.g.

    sbatch slurm/multi_node.sbatch slurm/check_job.py --world-size 4 --nodes 2

Every rank prints one ``STARTED`` line once MPI is up on it and takes part in every check,
then rank 0 prints one ``CHECK <name> ... OK`` (or ``FAIL``) line per check, one ``RANKINFO``
line per rank, and finally ``ALL CHECKS OK``.
Any failed check makes every rank exit 1; an unexpected exception on one rank aborts the whole
MPI job (an exception on one rank alone would leave the others hanging in a collective).

Why each check: a wrong ``srun --mpi=`` plugin does not fail, it silently starts N singleton
"worlds" of size 1 that all exit 0 -- so the world size and node count must be asserted, not
assumed. The allreduce and DDP checks prove data actually crosses nodes and that gradient
averaging is right (not merely that every rank ended with the same numbers).

Uses only the public API: ``import hpccomm`` registers the backend, ranks and world size come
from MPI (no MASTER_ADDR/MASTER_PORT), and hpccomm exports RANK/WORLD_SIZE/LOCAL_RANK/
LOCAL_WORLD_SIZE after init.
"""

import argparse
import os
import socket
import sys
import traceback


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--world-size", type=int, default=None,
                   help="expected number of ranks (default: $SLURM_NTASKS)")
    p.add_argument("--nodes", type=int, default=None,
                   help="expected number of distinct hostnames (default: $SLURM_JOB_NUM_NODES)")
    p.add_argument("--gpu-binding", choices=["per-rank", "none", "any"], default="any",
                   help="per-rank: every rank has a non-empty CUDA_VISIBLE_DEVICES, distinct from "
                        "the other ranks on its node; none: every rank has no visible GPU; "
                        "any: not checked")
    p.add_argument("--ddp-steps", type=int, default=3)
    args = p.parse_args()
    # Defaults from the allocation. Under mpirun the SLURM_* variables describe the launcher
    # daemon rather than the rank, but SLURM_NTASKS and SLURM_JOB_NUM_NODES are job-wide.
    if args.world_size is None:
        args.world_size = int(os.environ.get("SLURM_NTASKS", "0")) or None
    if args.nodes is None:
        args.nodes = int(os.environ.get("SLURM_JOB_NUM_NODES", "0")) or None
    return args


def abort_world(code):
    """End every rank of the job, not only this one."""
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        from mpi4py import MPI
        MPI.COMM_WORLD.Abort(code)
    finally:
        os._exit(code)


def run_checks(args):
    import torch
    import torch.distributed as dist
    import hpccomm  # registers the "hpccomm" backend

    # hpccomm.identity() starts MPI (MPI_Init, then the node and control communicators). A rank
    # that crashes before its STARTED line crashed there, before any hpccomm collective ran.
    started = hpccomm.identity()
    print(f"STARTED rank={started.rank} host={socket.gethostname()} pid={os.getpid()}", flush=True)
    dist.init_process_group("hpccomm")
    rank, world = dist.get_rank(), dist.get_world_size()
    results = []  # (name, ok, detail) -- identical on every rank: computed from gathered data

    def check(name, ok, detail):
        results.append((name, bool(ok), detail))

    # --- who is where ----------------------------------------------------------------------
    me = {
        "rank": rank,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "env_rank": os.environ.get("RANK"),
        "env_world": os.environ.get("WORLD_SIZE"),
        "local_rank": os.environ.get("LOCAL_RANK"),
        "local_world": os.environ.get("LOCAL_WORLD_SIZE"),
        "cvd": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }
    everyone = [None] * world
    dist.all_gather_object(everyone, me)

    if args.world_size is not None:
        check("world_size", world == args.world_size,
              f"world_size={world} expected={args.world_size}")
    else:
        check("world_size", world >= 1, f"world_size={world} (no expectation given)")

    hosts = sorted({e["host"] for e in everyone})
    if args.nodes is not None:
        check("nodes", len(hosts) == args.nodes,
              f"nodes={len(hosts)} hosts={','.join(hosts)} expected={args.nodes}")

    # hpccomm's exported environment must match what the process group says, and LOCAL_RANK
    # must number the ranks of each host 0..k-1.
    env_ok = all(e["env_rank"] == str(e["rank"]) and e["env_world"] == str(world)
                 for e in everyone)
    by_host = {}
    for e in everyone:
        by_host.setdefault(e["host"], []).append(e)
    for members in by_host.values():
        local = sorted(e["local_rank"] or "?" for e in members)
        env_ok &= local == [str(i) for i in range(len(members))]
        env_ok &= all(e["local_world"] == str(len(members)) for e in members)
    check("env", env_ok, "RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE consistent=" + str(env_ok))

    if args.gpu_binding == "per-rank":
        ok = True
        for members in by_host.values():
            cvds = [e["cvd"] for e in members]
            ok &= all(cvds) and len(set(cvds)) == len(cvds)
        check("gpu_binding", ok,
              "distinct CUDA_VISIBLE_DEVICES per local rank: "
              + " ".join(f"{e['host']}/{e['local_rank']}={e['cvd']}" for e in everyone))
    elif args.gpu_binding == "none":
        ok = all(not e["cvd"] for e in everyone)
        check("gpu_binding", ok, "no visible GPU on any rank: "
              + " ".join(f"{e['rank']}={e['cvd']!r}" for e in everyone))

    # --- allreduce SUM -------------------------------------------------------------------------
    small = torch.full((4,), float(rank + 1))
    dist.all_reduce(small, op=dist.ReduceOp.SUM)
    want = world * (world + 1) / 2
    # A larger tensor with distinct values per element and rank (exact in float32).
    n = 100_000
    big = torch.arange(n, dtype=torch.float32) + rank
    dist.all_reduce(big)
    big_want = torch.arange(n, dtype=torch.float32) * world + world * (world - 1) / 2
    check("allreduce", torch.all(small == want).item() and torch.equal(big, big_want),
          f"sum={small[0].item()} expected={want} n={n} exact={torch.equal(big, big_want)}")

    # --- DDP ------------------------------------------------------------------------------------
    # Different initial weights per rank (DDP must broadcast rank 0's) and different data per
    # rank (DDP must average gradients). A single-process reference trained on every rank's
    # batch with the mean of the per-rank losses must end at the same parameters.
    torch.manual_seed(1234 + rank)
    model = torch.nn.Linear(8, 4)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    init = [p.detach().clone() for p in model.parameters()]  # rank 0's, after the broadcast
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(99)
    batches = [[(torch.randn(16, 8, generator=gen), torch.randn(16, 4, generator=gen))
                for _ in range(world)] for _ in range(args.ddp_steps)]
    for step in range(args.ddp_steps):
        x, y = batches[step][rank]
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()

    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(gathered, flat)
    spread = max((g - gathered[0]).abs().max().item() for g in gathered)

    ref = torch.nn.Linear(8, 4)
    with torch.no_grad():
        for p, q in zip(ref.parameters(), init):
            p.copy_(q)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for step in range(args.ddp_steps):
        ref_opt.zero_grad()
        loss = sum(torch.nn.functional.mse_loss(ref(x), y) for x, y in batches[step]) / world
        loss.backward()
        ref_opt.step()
    ref_flat = torch.cat([p.detach().reshape(-1) for p in ref.parameters()])
    ref_err = (flat - ref_flat).abs().max().item()
    moved = (flat - torch.cat([q.reshape(-1) for q in init])).abs().max().item()
    check("ddp", spread <= 1e-6 and ref_err <= 1e-5 and moved > 0,
          f"steps={args.ddp_steps} params_equal_across_ranks max_diff={spread:.3g} "
          f"vs_reference={ref_err:.3g} moved={moved:.3g}")

    # --- verdict ------------------------------------------------------------------------------
    # Every rank computed the same verdicts from the same gathered data; agree anyway, so a
    # rank-local surprise cannot make some ranks exit 0 and others 1.
    bad = torch.tensor([sum(not ok for _, ok, _ in results)], dtype=torch.float32)
    dist.all_reduce(bad, op=dist.ReduceOp.MAX)
    if rank == 0:
        for e in everyone:
            print(f"RANKINFO rank={e['rank']} host={e['host']} local_rank={e['local_rank']} "
                  f"local_world_size={e['local_world']} "
                  f"CUDA_VISIBLE_DEVICES={e['cvd'] if e['cvd'] is not None else '<unset>'}")
        for name, ok, detail in results:
            print(f"CHECK {name} {detail} {'OK' if ok else 'FAIL'}")
        print("ALL CHECKS OK" if bad.item() == 0 else f"CHECKS FAILED: {int(bad.item())}",
              flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0 if bad.item() == 0 else 1


def main():
    args = parse_args()
    try:
        rc = run_checks(args)
    except BaseException:  # noqa: BLE001  anything, including SystemExit from deep inside
        print(f"[rank {os.environ.get('RANK', '?')} on {socket.gethostname()}] check_job.py "
              "crashed:", file=sys.stderr)
        traceback.print_exc()
        abort_world(2)
    sys.exit(rc)


if __name__ == "__main__":
    main()
