"""``python -m hpccomm bench|info``: the command-line tools.

``bench`` times collectives (or training steps) against Gloo and raw MPI;
``info`` reports the installation, the active paths and the job's layout.
Both live in :mod:`hpccomm.cli`, apart from the backend, and are imported
only when asked for.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

COMMANDS = {
    "bench": ("hpccomm.cli.bench", "time collectives or training steps against Gloo and raw MPI"),
    "info": ("hpccomm.cli.info", "versions, active paths, launcher, topology and settings"),
}


def main(argv: Sequence[str] | None = None) -> None:
    """Run the command named by the first argument."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in COMMANDS:
        lines = [f"  {name:6s} {summary}" for name, (_module, summary) in COMMANDS.items()]
        print("usage: python -m hpccomm {bench,info} [options]\n\ncommands:\n" + "\n".join(lines), file=sys.stderr)
        sys.exit(0 if args[:1] in (["-h"], ["--help"]) else 2)
    module, _summary = COMMANDS[args[0]]
    importlib.import_module(module).main(args[1:])


if __name__ == "__main__":
    main()
