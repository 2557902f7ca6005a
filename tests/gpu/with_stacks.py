"""``python3 with_stacks.py -c CODE [ARGS]`` or ``-m MODULE [ARGS]``: as ``python3 -c`` or ``-m``, but
every thread's stack prints on SIGUSR1 (faulthandler), as in rankcheck and the benchmarks.

The GPU acceptance run's set-up steps in Python (its probes and installs: ``python_step`` in
tests/gpu/limits.sh) run through this, so that one past its limit shows where it stood: a torch, MPI or
UCC load that hangs in a C library names the Python line that called it. ``sys.path`` is python3's for
``-c`` or ``-m``: the working directory first (``''`` or its path), not this folder; under
``PYTHONSAFEPATH=1`` (the probes), neither.
"""

import faulthandler
import os
import runpy
import signal
import sys

faulthandler.register(signal.SIGUSR1, all_threads=True)

if len(sys.argv) < 3 or sys.argv[1] not in ("-c", "-m"):
    sys.exit("usage: python3 with_stacks.py -c CODE [ARGS] | -m MODULE [ARGS]")
_, flag, what, *args = sys.argv
if not getattr(sys.flags, "safe_path", False):  # PYTHONSAFEPATH: Python 3.11 and later
    sys.path[0] = "" if flag == "-c" else os.getcwd()  # where python3 puts this file's folder
if flag == "-c":
    sys.argv = ["-c", *args]
    code = compile(what, "<string>", "exec", dont_inherit=True)
    exec(code, {"__name__": "__main__", "__builtins__": __builtins__})
else:
    sys.argv = [what, *args]  # run_module puts the module's file first, as -m does
    runpy.run_module(what, run_name="__main__", alter_sys=True)
