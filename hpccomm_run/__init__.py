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

This package stands apart from the ``hpccomm`` package on purpose: importing
``hpccomm`` imports torch (about a second) to register the backend, which
the launcher has no use for. It imports nothing but the standard library and,
to name the MPI library, mpi4py (without starting MPI). Its parts:
:mod:`~hpccomm_run.library` (the MPI library and the settings valid for it,
among them :func:`library_defaults` and :func:`singleton_defaults`, which
hpccomm applies when it starts MPI), :mod:`~hpccomm_run.launchers` (the
``mpiexec`` that belongs to it) and :mod:`~hpccomm_run.command` (the command
line and :func:`main`).
"""

from __future__ import annotations

from .command import (FT_DETECTOR_SETTINGS, FT_DETECTOR_TIMEOUT_S, Launch, build_launch, describe,
                      fault_tolerance_settings, main, resolve_interpreter)
from .launchers import Launcher, find_launcher, identify_launcher
from .library import (MPICH_FAMILIES, MpiLibrary, Setting, apply_mpi_library_defaults, apply_singleton_defaults,
                      describe_library, library_defaults, mpi_library, parse_library_version, single_node_defaults,
                      singleton_defaults)

__all__ = [
    "FT_DETECTOR_SETTINGS",
    "FT_DETECTOR_TIMEOUT_S",
    "MPICH_FAMILIES",
    "Launch",
    "Launcher",
    "MpiLibrary",
    "Setting",
    "apply_mpi_library_defaults",
    "apply_singleton_defaults",
    "build_launch",
    "describe",
    "describe_library",
    "fault_tolerance_settings",
    "find_launcher",
    "identify_launcher",
    "library_defaults",
    "main",
    "mpi_library",
    "parse_library_version",
    "resolve_interpreter",
    "single_node_defaults",
    "singleton_defaults",
]
