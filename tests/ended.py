"""How a program ended, read from its output: the error that ended it, or where it stood when it was stopped.

Shared by the GPU acceptance run's report (tests/gpu/targets.py) and ``benchmarks/cuda_allreduce.py
--compare``: both name a failed part or job by the error its output names, not by its last lines, which
after an MPI job's abort are the launcher's own notice and say nothing of the cause. Only the standard
library: targets.py runs where nothing but pytest is installed.
"""

from __future__ import annotations

import re

#: hpccomm's line as a rank ends the job over an exception (hpccomm/failure.py); the first names the first error.
UNCAUGHT = re.compile(r"hpccomm: rank (\d+): uncaught (.+?); aborting the job")
#: A Python traceback's last line, ``SomeError: message``, behind torch's ``[rank0]:``, pytest's ``E``, or an
#: MPI launcher's ``[1,0]<stderr>:``.
EXCEPTION = re.compile(r"^(?:E\s+|\[rank(\d+)\]:\s*|\[[^\]]*\]<\w+>:\s*)?"
                       r"((?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception|Interrupt)(?::.*)?)$")
#: Any other line that says "error" (a C program's own words, as ucc_perftest's), but an MPI launcher's notices.
ERROR_WORD = re.compile(r"error", re.IGNORECASE)
LAUNCHER_NOTICE = re.compile(r"ORTE_ERROR_LOG|PRTE_ERROR_LOG|errorcode|help message|error messages|MPI_ABORT")
#: faulthandler's dump of one thread's stack: a header, then its frames, innermost first. Whole lines only:
#: processes that print at once interleave their dumps mid-line, and a garbled line names no frame.
STACK_HEADER = re.compile(
    r"^(?:\[[^\]]*\]\S*:\s*)?(Current thread|Thread) 0x[0-9a-f]+ [^()]*\(most recent call first\):$")
FRAME = re.compile(r'^(?:\[[^\]]*\]\S*:\s*)?\s+File "([^"]+)", line (\d+) in ([^\s"]+)$')
#: The GPU acceptance run's C stacks of a process past its limit (tests/gpu/limits.sh): its header, then gdb's
#: lines, each thread's (``Thread 1`` the main one) and its frames: ``#0  0x... in poll () from LIB`` or
#: ``#3  name (arguments) at FILE:LINE``, a C++ name with its parameters (``f(int) const``), a clone's ``[clone
#: .cold]``.
NATIVE_HEADER = re.compile(r"^acceptance: native stack of pid (\d+) \((\S*)")
NATIVE_THREAD = re.compile(r"^Thread (\d+) \(")
NATIVE_FRAME = re.compile(r"^#\d+\s+(?:0x[0-9a-f]+ in )?(.*?)(?: (?:from|at) \S+)?$")
NATIVE_FRAMES = 4
DETAIL_CHARS = 200


def one_line(text: str) -> str:
    """``text`` on one line (its whitespace folded), at most :data:`DETAIL_CHARS` characters."""
    text = " ".join(text.split())
    return text if len(text) <= DETAIL_CHARS else text[:DETAIL_CHARS - 3] + "..."


def error_that_ended(output: str) -> str | None:
    """The error a program's ``output`` names as what ended it, on one line; None where it names none.

    In order: hpccomm's own "uncaught" line (``rank R: SomeError: message``), the first Python exception a
    traceback ends with (a chained traceback prints its cause first), else the first line that says "error"
    and is not an MPI launcher's notice.
    """
    lines = output.splitlines()
    for line in lines:
        if found := UNCAUGHT.search(line):
            return one_line(f"rank {found[1]}: {found[2]}")
    for line in lines:
        if found := EXCEPTION.match(line.strip()):
            return one_line(f"rank {found[1]}: {found[2]}" if found[1] else found[2])
    for line in lines:
        if ERROR_WORD.search(line) and not LAUNCHER_NOTICE.search(line):
            return one_line(line)
    return None


def printed_a_python_stack(output: str) -> bool:
    """Whether ``output`` holds a Python stack, faulthandler's or a garbled one (whose frame :func:`stack_top`
    cannot name)."""
    return "(most recent call first)" in output


def stack_top(output: str) -> str | None:
    """``file:line in function``: the innermost frame of the main thread's stack, as printed; None if none.

    A program stopped past its limit prints every thread's stack on SIGUSR1 (faulthandler). The thread
    that took the signal is marked "Current thread": the main thread, to which Linux gives a signal that
    no thread blocks. Without that mark, the thread printed last: faulthandler lists threads newest first.
    (Where several ranks printed, the first rank's "Current thread".)
    """
    tops: list[tuple[bool, str | None]] = []  # per stack printed: (the current thread's, its innermost frame)
    for line in output.splitlines():
        if header := STACK_HEADER.match(line):
            tops.append((header[1] == "Current thread", None))
        elif tops and tops[-1][1] is None and (frame := FRAME.match(line)):
            tops[-1] = (tops[-1][0], f"{frame[1]}:{frame[2]} in {frame[3]}")
    framed = [(current, top) for current, top in tops if top]
    return next((top for current, top in framed if current), framed[-1][1] if framed else None)


def native_top(output: str) -> str | None:
    """``pid P (program): f0 < f1 < ...``: the innermost named C frames of the first process's main thread in
    the stacks gdb printed (tests/gpu/limits.sh), at most :data:`NATIVE_FRAMES`; None if none.

    Where no process past its limit printed a Python stack (ucc_perftest's ranks), this is where one stood.
    """
    process, frames, main = None, [], False
    for line in output.splitlines():
        if header := NATIVE_HEADER.match(line):
            if frames:
                break
            process, main = f"pid {header[1]} ({header[2].rsplit('/', 1)[-1]})", False
        elif process and (thread := NATIVE_THREAD.match(line)):
            if frames:
                break
            main = thread[1] == "1"
        elif main and (frame := NATIVE_FRAME.match(line)) and (name := frame_name(frame[1])) != "??":
            frames.append(name)
    return f"{process}: {' < '.join(frames[:NATIVE_FRAMES])}" if frames else None


def frame_name(frame: str) -> str:
    """The function of gdb's ``name (arguments)``: the name, without gdb's argument list (the last balanced
    parentheses) nor a ``[clone ...]`` suffix."""
    depth = 0
    for at in range(len(frame) - 1, -1, -1) if frame.endswith(")") else ():
        depth += {")": 1, "(": -1}.get(frame[at], 0)
        if depth == 0:
            frame = frame[:at]
            break
    return re.sub(r" \[clone [^]]*\]", "", frame).strip()
