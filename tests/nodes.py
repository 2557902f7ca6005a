"""Run rank scripts on fake nodes of this machine: the MPI wheel's own launcher across namespaces.

Each node is a holder process in a UTS namespace of its own (host name n1,
n2, ...) and a mount namespace with a private, empty /dev/shm and an
/etc/hosts that names every node (on loopback). The launcher
(``mpirun`` for Open MPI, ``mpiexec`` for MPICH, from this environment) starts
its daemons "on" a node through tests/nodes_agent.sh, which enters the node's
namespaces, so MPI sees one host per node: its own shared memory within a
node, TCP between nodes. The network namespace is the machine's. After the
run each node's /dev/shm is read back, so a test can assert that nothing was
left there. Needs root (unshare, nsenter, mount); missing it skips outside CI
and fails in CI (launch.skip_unless_ci), as for the Slurm tests.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from launch import DEFAULT_LIMIT_S, RankRun, run_launcher, skip_unless_ci
from mpi_library import family, openmpi_env

from hpccomm_run import find_launcher, mpi_library

AGENT = Path(__file__).parent / "nodes_agent.sh"


@dataclass
class NodesRun(RankRun):
    """A launch across nodes, plus what each node's /dev/shm held afterwards."""

    leftovers: dict[str, list[str]] = field(default_factory=dict)


def require_namespaces() -> None:
    """Skip (outside CI) or fail (in CI) when fake nodes cannot be made here."""
    missing = [tool for tool in ("unshare", "nsenter") if shutil.which(tool) is None]
    if os.geteuid() != 0:
        missing.append("root")
    if missing:
        skip_unless_ci(f"fake nodes need {', '.join(missing)}")


def run_on_nodes(
    per_node: Sequence[int],
    script: str,
    *args: str,
    round_robin: bool = False,
    env: dict[str, str] | None = None,
    limit_s: float = DEFAULT_LIMIT_S,
    launcher_options: Sequence[str] = (),
    stacks_on_timeout: bool = True,
    own_name_only: bool = False,
) -> NodesRun:
    """Run ``tests/ranks/<script>`` with ``per_node[i]`` ranks on fake node ``n<i+1>``.

    Args:
        per_node: ranks on each node.
        script: file name under tests/ranks.
        args: arguments for the script.
        round_robin: number ranks across nodes in turn (rank 0 on n1, rank 1
            on n2, ...) instead of node by node; needs the same count everywhere.
        env: extra environment variables for the ranks.
        limit_s: wall-clock limit; past it the run is killed and timed_out set.
        launcher_options: more options for the launcher (e.g. ``--with-ft ulfm``).
        stacks_on_timeout: see :func:`launch.run_launcher`.
        own_name_only: each node's /etc/hosts names that node alone, on
            127.0.1.1 (as Debian's installer writes it): no node can resolve
            another's name (a TCPStore found by its host name cannot start).
    """
    require_namespaces()
    hosts = [f"n{i + 1}" for i in range(len(per_node))]
    with tempfile.TemporaryDirectory(prefix="hpccomm-nodes-") as state:
        holders = [_start_node(host, state, _hosts_file([host] if own_name_only else hosts, state, host,
                                                         "127.0.1.1" if own_name_only else "127.0.0.1"))
                   for host in hosts]
        try:
            launcher = _launcher(hosts, per_node, round_robin) + list(launcher_options)
            run_env = {**openmpi_env(), **(env or {}), "HPCCOMM_TEST_NODES": state}
            run = run_launcher(launcher, script, *args, env=run_env, limit_s=limit_s,
                               stacks_on_timeout=stacks_on_timeout)
            leftovers = {host: sorted(os.listdir(f"/proc/{pid.pid}/root/dev/shm")) for host, pid in zip(hosts, holders)}
        finally:
            for holder in holders:
                holder.kill()
                holder.wait()
    return NodesRun(run.returncode, run.output, run.timed_out, ranks_ended_at=run.ranks_ended_at, leftovers=leftovers)


def _hosts_file(names: list[str], state: str, host: str, address: str) -> str:
    """``host``'s /etc/hosts: this machine's, plus ``names`` on ``address`` (a loopback one)."""
    path = os.path.join(state, f"hosts-{host}")
    with open("/etc/hosts") as original, open(path, "w") as hosts_file:
        hosts_file.write(original.read().rstrip("\n") + f"\n{address} {' '.join(names)}\n")
    return path


def _start_node(host: str, state: str, hosts_file: str) -> subprocess.Popen:
    """A holder process in new UTS and mount namespaces: host name ``host``, its own empty /dev/shm."""
    holder = subprocess.Popen(
        ["unshare", "--uts", "--mount", "--propagation", "private", "--", "/bin/sh", "-c",
         f"hostname {host} && mount -t tmpfs -o mode=1777 tmpfs /dev/shm && mount --bind {hosts_file} /etc/hosts"
         " && echo ready && exec sleep 100000"],
        stdout=subprocess.PIPE, text=True, start_new_session=True,
    )
    if holder.stdout.readline().strip() != "ready":
        holder.kill()
        raise RuntimeError(f"fake node {host} did not start (unshare/mount failed)")
    Path(state, f"{host}.pid").write_text(str(holder.pid))
    return holder


def _mpiexec() -> str:
    """The launcher of the MPI library mpi4py loads (hpccomm-run's choice)."""
    return find_launcher(mpi_library())[0].path


def _launcher(hosts: list[str], per_node: Sequence[int], round_robin: bool) -> list[str]:
    nprocs = str(sum(per_node))
    if family() == "openmpi":
        spec = ",".join(f"{host}:{n}" for host, n in zip(hosts, per_node))
        mapping = ["--map-by", "node"] if round_robin else []
        return [_mpiexec(), "-n", nprocs, "--host", spec, *mapping, "--bind-to", "none",
                "--mca", "plm_rsh_agent", str(AGENT)]
    spec = ",".join(f"{host}:{1 if round_robin else n}" for host, n in zip(hosts, per_node))
    return [_mpiexec(), "-n", nprocs, "-hosts", spec, "-launcher", "ssh", "-launcher-exec", str(AGENT)]

