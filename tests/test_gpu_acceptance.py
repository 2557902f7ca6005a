"""The GPU acceptance command (tests/gpu/acceptance.sh): its half that runs here, and its other half rehearsed.

The GPU machine cannot download anything: ``prepare`` must assemble, on this
machine, the wheels ``run`` installs there, and the UCC source ``run`` builds
there (the shared autogen'd tarball, where found) with a libucx-cu13 wheel,
within what the device tool carries. The GPU-only files must at least compile
here, where nothing runs them, the GPU checks' imports must run, and each of
the run's diagnoses must select one of them. ``run`` itself runs here without
a GPU, without UCC and with hpccomm's UCC for host memory: each part's limit
(and each set-up step's), and its report naming what failed.
"""

from __future__ import annotations

import ast
import os
import py_compile
import re
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
from hpccomm.ucc import binding
from scripts import REPO, load_script
from transports import needs_ucc

# Its result is the same under every torch release and MPI: CI runs it in its first step only (.ci/run).
pytestmark = pytest.mark.one_environment

SCRIPT = REPO / "tests" / "gpu" / "acceptance.sh"
#: The run's limits (a part's, a set-up step's), which SCRIPT sources.
LIMITS = REPO / "tests" / "gpu" / "limits.sh"
#: The checks tests/gpu runs on every CUDA path, and the run's diagnoses one by one.
GPU_CHECKS = REPO / "tests" / "gpu" / "ranks" / "cuda_ops.py"
#: What names each part that failed or hung in targets.md (a script, in no package: load_script).
TARGETS = REPO / "tests" / "gpu" / "targets.py"
#: Where prepare finds a UCC source tarball when given none (as .ci/run does).
UCC_TARBALLS = [REPO.parent / "shared" / "ucc" / "ucc-1.8.0-autogen.tar.gz",
                Path("/work/shared/ucc/ucc-1.8.0-autogen.tar.gz")]


def test_prepare_assembles_the_bundle_the_gpu_machine_installs_from(tmp_path):
    bundle = tmp_path / "bundle"
    # Without the UCC prebuild (tests/gpu/prebuild_ucc.sh: 2 minutes and 240 MB of downloads, too much for every
    # CI run; run by hand before each GPU session, its output checked there by the acceptance run's set-up).
    env = {**os.environ, "HPCCOMM_PREBUILD_UCC": "0"}
    proc = subprocess.run(["bash", str(SCRIPT), "prepare", str(bundle)], capture_output=True, text=True, timeout=300,
                          env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    wheels = sorted(path.name for path in (bundle / "wheels").iterdir())
    assert any(name.startswith("cffi-") and "-cp312-" in name and "x86_64" in name for name in wheels), wheels
    assert any(name.startswith("pytest-") for name in wheels), wheels
    if os.environ.get("HPCCOMM_UCC_SOURCE") or any(path.is_file() for path in UCC_TARBALLS):
        assert (bundle / "ucc-source.tar.gz").is_file(), proc.stdout
        assert any((bundle / "ucx").glob("libucx_cu13-*.whl")), proc.stdout
    # The commit, for report.md: the device tool copies the working tree without its history.
    head = subprocess.run(["git", "log", "-1", "--format=%h"], capture_output=True, text=True, cwd=REPO).stdout
    assert (bundle / "source.txt").read_text().startswith(head.strip() + " "), proc.stdout
    size = sum(path.stat().st_size for path in bundle.rglob("*") if path.is_file())
    assert size < 60e6, f"the bundle takes {size / 1e6:.1f} MB: the device tool carries 64 MiB at most"


def test_the_gpu_only_code_compiles_and_the_script_parses():
    for path in [*(REPO / "tests" / "gpu").rglob("*.py"), REPO / "benchmarks" / "cuda_allreduce.py",
                 REPO / "benchmarks" / "cuda_call_stages.py",
                 REPO / "benchmarks" / "cuda_staging_floor.py", REPO / "hpccomm" / "transports" / "device_ops.py"]:
        py_compile.compile(str(path), doraise=True)
    for script in (SCRIPT, LIMITS, REPO / "tests" / "build_ucc.sh"):
        assert subprocess.run(["bash", "-n", str(script)]).returncode == 0, script


def test_the_gpu_checks_import_what_they_use_here_too():
    # tests/gpu/ranks/cuda_ops.py runs only on a GPU. Its imports (benchmarks/cuda_call_stages.py's StageStamps
    # among them) run here, up to its first MPI call, so that a path or a name it gets wrong fails on the CPU.
    prelude = GPU_CHECKS.read_text().split("\ndist.init_process_group(")[0]
    script = (f"names = {{'__file__': {str(GPU_CHECKS)!r}, '__name__': 'cuda_ops'}}\n"
              f"exec(compile({prelude!r}, {str(GPU_CHECKS)!r}, 'exec'), names)\n"
              "print(names['StageStamps'].__module__, names['run_all'].__module__)\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["cuda_call_stages", "rankcheck"], proc.stdout


def test_each_diagnosis_selects_one_gpu_check():
    # The run's diagnoses (diag-*.txt) each run one check of cuda_ops.py, chosen by a part of its name; a name
    # that matches none fails the job (rankcheck), but only on the GPU: here, every one matches exactly one.
    checks = [node.name for node in ast.parse(GPU_CHECKS.read_text()).body if isinstance(node, ast.FunctionDef)
              and any(isinstance(d, ast.Name) and d.id == "check" for d in node.decorator_list)]
    selections = re.findall(r"tests/gpu/ranks/cuda_ops\.py\s+(\w+)", SCRIPT.read_text().replace("\\\n", " "))
    assert {"compute_stream", "missing_peer", "sizes_from_empty"} <= set(selections), selections
    for part in selections:
        assert len([name for name in checks if part in name]) == 1, (part, checks)


def test_every_python_program_the_run_bounds_prints_its_stacks_past_its_limit():
    # limits.sh sends SIGUSR1 only to Python processes that handle it: one that does not is ended without a word of
    # where it stood (cuda_call_stages.py and cuda_staging_floor.py until 2026-12-06, the UCC parts likeliest to
    # hang). Its own faulthandler, or rankcheck's.
    programs = set(re.findall(r"\b((?:benchmarks|tests/gpu/ranks)/\w+\.py)\b", SCRIPT.read_text()))
    assert {"benchmarks/cuda_allreduce.py", "benchmarks/cuda_call_stages.py", "benchmarks/cuda_staging_floor.py",
            "tests/gpu/ranks/cuda_ops.py"} <= programs, programs
    for program in sorted(programs):
        source = (REPO / program).read_text()
        assert "faulthandler.register(signal.SIGUSR1" in source or "from rankcheck import" in source, program


def test_a_ucc_build_lands_in_a_prefix_with_nothing_of_an_earlier_build_left(tmp_path):
    # tests/build_ucc.sh: on the H100 a UCC rebuilt without tl/nccl into the same prefix most likely still had
    # the first build's tl/nccl there (issue 39). Before it builds, an earlier build of its own is removed, and
    # any other non-empty directory is refused untouched; stopped here at the source check, past that step.
    build = REPO / "tests" / "build_ucc.sh"
    source, wheel = tmp_path / "ucc-source", tmp_path / "libucx_cu13-1.22.0-py3-none-any.whl"
    source.mkdir()  # no configure script: the build stops once the prefix is ready
    wheel.write_bytes(b"")
    earlier = tmp_path / "earlier"
    stale = [earlier / "lib" / "ucc" / "libucc_tl_nccl.so", earlier / "ucx" / "libucx" / "lib" / "libucp.so",
             earlier / "make.log", earlier / "PREBUILT", earlier / "ucc-env.sh"]
    for path in stale:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("from the earlier build\n")
    (earlier / ".build_ucc").write_text("made by tests/build_ucc.sh\n")
    proc = subprocess.run(["bash", str(build), "--no-mpi", str(source), str(wheel), str(earlier)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "has no configure script" in proc.stderr, proc.stdout + proc.stderr
    assert [path for path in stale if path.exists()] == [], sorted(map(str, earlier.rglob("*")))
    assert (earlier / ".build_ucc").is_file()
    other = tmp_path / "other"
    other.mkdir()
    (other / "lib").mkdir()
    (other / "lib" / "keep.so").write_text("not UCC's\n")
    proc = subprocess.run(["bash", str(build), "--no-mpi", str(source), str(wheel), str(other)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "did not make it" in proc.stderr, proc.stdout + proc.stderr
    assert (other / "lib" / "keep.so").read_text() == "not UCC's\n"


def hanging_program(tmp_path: Path, prints_stacks: bool = True) -> Path:
    """A program that starts a child in a session of its own (as tests/launch.py starts a rank job), prints
    ``child PID`` and sleeps, as the child does; both print their stacks on SIGUSR1 where ``prints_stacks``."""
    program = tmp_path / "hangs.py"
    stacks = "faulthandler.register(signal.SIGUSR1, all_threads=True)\n" if prints_stacks else ""
    program.write_text(
        "import faulthandler, signal, subprocess, sys, time\n"
        f"{stacks}"
        "if len(sys.argv) == 1:\n"
        "    child = subprocess.Popen([sys.executable, __file__, 'child'], start_new_session=True)\n"
        "    print('child', child.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    return program


def test_a_part_past_its_limit_is_ended_with_every_process_it_started_after_printing_its_stacks(tmp_path):
    # limits.sh's `within`: the H100's first run hung in one part and lost every later one. The child starts a
    # session of its own, as tests/launch.py starts a rank job.
    program = hanging_program(tmp_path)
    part = tmp_path / "part.txt"
    script = (f"set +e\nstarted=$SECONDS\nsource {LIMITS}\nbudget=$((STACKS_S + 60))\n"
              f"within 2 {part} python3 {program}; echo rc=$?\n"
              f"within 5 {tmp_path / 'quick.txt'} echo quick; echo rc=$?\n")
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)
    assert "rc=124" in proc.stdout and "rc=0" in proc.stdout, proc.stdout + proc.stderr
    log = part.read_text()
    assert log.count("most recent call first") == 2, log  # both processes printed their stacks
    assert "HUNG: still running at its 2 s limit" in log and "Killed" not in log, log  # the HUNG line says it
    if shutil.which("gdb"):  # and each process's C stack (where it sleeps): a hang inside a C library
        assert log.count("acceptance: native stack of pid") == 2 and "\n#0 " in log, log
    else:
        assert "acceptance: no gdb here" in log, log
    child = int(log.split("child ")[1].split()[0])
    assert not os.path.exists(f"/proc/{child}") or "zombie" in open(f"/proc/{child}/status").read().lower(), \
        "a process the part started outlived it"
    assert (tmp_path / "quick.txt").read_text().startswith("quick\n")
    # targets.md names the part by its limit and where its main thread stood, read from these real stacks. The
    # two processes print at once, and their dumps may interleave mid-line (7 of 19 runs of one loop here, 2 of 60
    # of another): then it names no frame rather than a wrong one.
    targets = load_script(TARGETS)
    ended = "- part.txt: the part was ended at its 2 s limit"
    assert targets.other_parts(tmp_path) in ([f"{ended}; top frame: {program}:6 in <module>"], [ended]), log


def machine_without(tmp_path: Path, *missing: str) -> str:
    """A PATH with every command of this one but ``missing``: as the GPU machine, whose image has no gdb and may
    have no procps (ps, pkill)."""
    farm = tmp_path / "bin"
    farm.mkdir()
    for folder in os.environ["PATH"].split(os.pathsep):
        for command in Path(folder).glob("*") if Path(folder).is_dir() else ():
            if command.name not in missing and not (farm / command.name).exists() and os.access(command, os.X_OK):
                (farm / command.name).symlink_to(command)
    return str(farm)


def test_a_part_past_its_limit_is_ended_on_a_machine_without_procps_or_gdb(tmp_path):
    # Until 2026-12-06 a limit started its clock once `ps` named the step's session, and ended the step's session
    # with `pkill`: without procps it waited for ever, and no part had a limit. The GPU machine has no gdb either.
    program = hanging_program(tmp_path)
    part = tmp_path / "part.txt"
    script = (f"set +e\nstarted=$SECONDS\nsource {LIMITS}\nbudget=$((STACKS_S + 60))\necho stacks=$STACKS_S\n"
              f"within 2 {part} python3 {program}; echo rc=$? after=$((SECONDS - started))\n")
    path = machine_without(tmp_path, "ps", "pkill", "pgrep", "gdb", "cuda-gdb")
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PATH": path})
    log = part.read_text()
    assert re.search(r"rc=124 after=([2-9]|1[0-2])\n", proc.stdout), proc.stdout + proc.stderr + log
    assert "stacks=10\n" in proc.stdout, proc.stdout  # no time kept for a debugger there is not
    assert log.count("most recent call first") == 2 and "acceptance: no gdb here (nor cuda-gdb)" in log, log
    assert "HUNG: still running at its 2 s limit" in log and "command not found" not in log, log
    child = int(log.split("child ")[1].split()[0])
    assert not os.path.exists(f"/proc/{child}") or "zombie" in open(f"/proc/{child}/status").read().lower(), \
        "a process the part started outlived it"


def test_a_part_of_programs_not_python_past_its_limit_shows_where_each_rank_stood_in_c(tmp_path):
    # ucc_perftest's ranks print no Python stack, and SIGUSR1 would end them before gdb could read theirs (it
    # hung once in three runs on the H200, 2026-11-26): here two `tail`s under a shell stand for mpirun's ranks.
    part = tmp_path / "perftest.txt"
    script = (f"set +e\nstarted=$SECONDS\nsource {LIMITS}\nbudget=$((STACKS_S + 60))\n"
              f"within 2 {part} bash -c 'tail -f /dev/null & tail -f /dev/null & echo ranks $(jobs -p); wait'\n")
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)
    log = part.read_text()
    assert "HUNG: still running at its 2 s limit" in log, proc.stdout + proc.stderr + log
    ranks = [int(pid) for pid in log.split("ranks ")[1].split("\n")[0].split()]
    assert len(ranks) == 2, log
    for pid in ranks:
        assert not os.path.exists(f"/proc/{pid}") or "zombie" in open(f"/proc/{pid}/status").read().lower(), \
            "a rank outlived its part"
    if not shutil.which("gdb"):
        assert "acceptance: no gdb here" in log, log
        return
    # Each rank's C stack (it was still there: no SIGUSR1 ended it), not the shell's, which started them.
    stacks = re.findall(r"acceptance: native stack of pid (\d+) \((\S+)", log)
    assert sorted(int(pid) for pid, _ in stacks) == ranks and {name for _, name in stacks} == {"tail"}, log
    assert log.count("\n#0 ") >= 2, log
    # targets.md names where the first stood, by its main thread's top C frames.
    [named] = load_script(TARGETS).other_parts(tmp_path)
    assert re.fullmatch(rf"- perftest.txt: the part was ended at its 2 s limit; top C frames, pid {stacks[0][0]} "
                        r"\(tail\): \S+( < \S+)*", named), (named, log)


def test_a_set_up_probe_past_its_limit_prints_where_it_stood_and_is_ended(tmp_path):
    # limits.sh's `probe`, as the run's set-up uses it: its first probe asks torch how many GPUs there are, and a
    # load that hangs there (a driver, MPI or UCC) must show where it stood and end at its limit, as a part does;
    # until 2026-12-05 `timeout` ended it without a word. Here torch is a stand-in whose device_count sleeps 30 s.
    fake = tmp_path / "fake"
    (fake / "torch").mkdir(parents=True)
    (fake / "torch" / "__init__.py").write_text(
        "import os, sys, time\n"
        "class cuda:\n"
        "    @staticmethod\n"
        "    def device_count():\n"
        "        print('pid', os.getpid(), file=sys.stderr, flush=True)\n"
        "        time.sleep(30)\n"
    )
    # What a probe sees: its arguments, and which of the working directory ('' or its path) and tests/gpu (the
    # wrapper's folder) are on sys.path.
    (fake / "probe_sees.py").write_text(
        "import os, sys\n"
        "print(sys.argv[1:], [p for p in sys.path if p in ('', os.getcwd()) or p.endswith(os.sep + 'gpu')])\n"
    )
    sees = "import runpy; runpy.run_module('probe_sees', run_name='__main__')"
    setup_log = tmp_path / "set-up.txt"
    script = (f"set +e\nstarted=$SECONDS\nsource {LIMITS}\nbudget=$((STACKS_S + 60))\nPROBE_S=4\n"
              f"setup_log={setup_log}\n"
              "gpus=$(probe -c 'import torch; print(torch.cuda.device_count())'); echo rc=$? gpus=$gpus.\n"
              "probe -m probe_sees one two; echo rc=$?\n"
              f"probe -c \"{sees}\" three; echo rc=$?\n"
              f"python_step 10 -c \"{sees}\" four; echo rc=$?\n"
              "probe -c 'import sys; sys.stderr.write(\"no newline\")'; echo rc=$?\n"
              "probe -c 'import no_ucc_here'; echo rc=$?\n"
              "setup_log= probe -m probe_sees six 2>>stderr.txt; echo rc=$?\n"
              "budget=0; probe -m probe_sees five; echo rc=$?\n")
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(fake)})
    out, err, setup = proc.stdout, proc.stderr, setup_log.read_text()
    assert "rc=124 gpus=.\n" in out, out + err + setup  # the caller reads no answer, and the status says why
    # The probes' stderr went to set-up.txt, each probe's under a line naming it, none of it to the caller's.
    assert setup.startswith("acceptance: set-up: python3 -c import torch; print(torch.cuda.device_count())\n"), setup
    assert "HUNG" not in err and "Traceback" not in err, err
    assert "most recent call first" in setup and "line 6 in device_count" in setup, setup  # where it stood
    assert 'File "<string>", line 1 in <module>' in setup, setup
    assert "acceptance: HUNG: still running at its 4 s limit" in setup and "Killed" not in setup + err, setup
    if shutil.which("gdb"):
        assert "acceptance: native stack of pid" in setup and "\n#0 " in setup, setup
    else:
        assert "acceptance: no gdb here" in setup, setup
    assert "pid " in setup, setup
    pid = int(setup.split("pid ")[1].split()[0])
    assert not os.path.exists(f"/proc/{pid}") or "zombie" in open(f"/proc/{pid}/status").read().lower(), \
        "the hung probe outlived its limit"
    # Otherwise a probe is python3 -m or -c, seeing neither the working directory nor its wrapper's folder
    # (PYTHONSAFEPATH); another set-up step sees the working directory first, as python3 -c would.
    assert "['one', 'two'] []\nrc=0\n" in out and "['three'] []\nrc=0\n" in out, out + err
    assert "['four'] ['']\nrc=0\n" in out, out + err
    assert "acceptance: set-up: python3 -m probe_sees one two\n" in setup, setup
    # Each step's lines start on a line of their own, whatever the step before left; where no set-up.txt is set,
    # a step's lines go where stderr goes, which the caller may append to.
    assert "no newline\nacceptance: set-up: python3 -c import no_ucc_here\n" in setup, setup
    assert (tmp_path / "stderr.txt").read_text() == "acceptance: set-up: python3 -m probe_sees six\n", setup
    assert "['six'] []\nrc=0\n" in out and "six" not in setup, out + setup
    # A probe that fails says so in its part of the log; none starts once the budget is spent.
    assert "No module named 'no_ucc_here'\nacceptance: exit status 1 after" in setup and "rc=1\n" in out, \
        out + setup
    assert out.endswith("rc=124\n"), out + setup
    assert re.search(r"acceptance: set-up: python3 -m probe_sees five\nacceptance: out of time \(budget 0 s\), "
                     r"not started: python3 \S+/with_stacks.py -m probe_sees five\n"
                     r"acceptance: exit status 124 after \d+ s\n\Z", setup), setup
    # targets.md reads set-up.txt step by step: it names each step that hung (by its limit and where it stood),
    # failed (by its error) or had no time left, by its command; the steps that ended well not at all.
    targets = load_script(TARGETS)
    assert targets.other_parts(tmp_path) == [
        f"- set-up.txt, `python3 -c import torch; print(torch.cuda.device_count())`: the step was ended at its 4 s "
        f"limit; top frame: {fake / 'torch' / '__init__.py'}:6 in device_count",
        "- set-up.txt, `python3 -c import no_ucc_here`: exit status 1: ModuleNotFoundError: No module named "
        "'no_ucc_here'",
        "- set-up.txt, `python3 -m probe_sees five`: did not run (no time left)"], setup


def test_every_limit_of_the_run_set_up_included_is_cut_to_what_is_left_of_its_budget(tmp_path):
    # A UCC fallback build (300 s) that hangs, then hpccomm's install (300 s), would have outlasted the 380 s
    # budget and the device call with it, ending it before report.md and targets.md were written: every set-up
    # step's limit is cut to what is left, as the parts' are, less the time a step past its limit takes to show
    # its stacks (STACKS_S: the budget here leaves 3 s past it, with the least a step starts with lowered to 2 s).
    hangs = ("import faulthandler, signal, time; faulthandler.register(signal.SIGUSR1, all_threads=True); "
             "time.sleep(120)")
    script = (f"set +e\nstarted=$SECONDS\nsource {LIMITS}\nMIN_STEP_S=2\nbudget=$((STACKS_S + 3))\n"
              "echo budget=$budget cut=$(budget_cut 300),$(budget_cut 2)\n"
              f"python_step \"$(budget_cut 300)\" -c '{hangs}'; echo rc=$? after=$((SECONDS - started))\n"
              "echo spent=$(budget_cut 300)\n"
              "python_step \"$(budget_cut 120)\" -c 'print(\"installed\")'; echo rc=$?\n"
              f"setup_log={tmp_path / 'set-up.txt'}\n"
              "setup_step \"$(budget_cut 60)\" -m zipfile -e ucx.whl ucx; echo rc=$?\nsetup_log=\n"
              f"within 60 {tmp_path / 'part.txt'} echo ran; echo rc=$?\n"
              # No step starts with less than MIN_STEP_S left past STACKS_S.
              "MIN_STEP_S=15\nbudget=$((SECONDS - started + STACKS_S + 13)); echo under=$(budget_cut 300)\n"
              "budget=$((SECONDS - started + STACKS_S + 40)); echo over=$(budget_cut 300)\n")
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=120)
    out, err = proc.stdout, proc.stderr
    budget = int(re.search(r"budget=(\d+) cut=3,2\n", out).group(1))
    # Ended at the cut limit, its stacks shown, all within the budget: not at its own end (120 s).
    assert "HUNG: still running at its 3 s limit" in err and "most recent call first" in err, out + err
    after = int(re.search(r"rc=124 after=(\d+)\n", out).group(1))
    assert after <= budget, out
    # With none of the budget left a step does not start, and says so.
    assert "spent=0\nrc=124\n" in out and "installed" not in out and "\nrc=124\nunder=0\n" in out, out
    assert f"acceptance: out of time (budget {budget} s), not started: python3" in err, err
    assert (tmp_path / "part.txt").read_text().startswith(f"acceptance: out of time (budget {budget} s), not "
                                                          "started: echo ran\nacceptance: exit status 124 after ")
    assert re.search(r"\nover=(39|40)\n", out), out
    # targets.md lists a set-up step and a part that had no time as such, not as failed.
    parts = load_script(TARGETS).other_parts(tmp_path)
    assert parts == ["- part.txt: did not run (no time left)",
                     "- set-up.txt, `python3 -m zipfile -e ucx.whl ucx`: did not run (no time left)"], parts
    # Every limited step of acceptance.sh takes its limit from budget_cut (the parts' `within` cuts its own): a
    # literal limit could outlast the budget again.
    literal = re.findall(r"\b(?:bounded|python_step|setup_step) +[0-9]+", SCRIPT.read_text())
    assert literal == [], literal


def test_a_part_starts_only_with_time_enough_and_one_the_budget_cut_says_so(tmp_path):
    # A pass given 20 s would be ended in its first checks and read as hung: a part starts only with PART_MIN_S (or
    # its own limit, where less) of the budget left, and a part whose limit the budget cut says so in its log, for
    # targets.md to name it as such rather than as hung (tests/test_gpu_targets.py).
    script = (f"set +e\nstarted=$SECONDS\nsource {LIMITS}\necho min=$PART_MIN_S\n"
              "budget=$((STACKS_S + PART_MIN_S + 10))\n"
              f"within 200 {tmp_path / 'cut.txt'} echo ran; echo rc=$?\n"
              f"within 10 {tmp_path / 'own.txt'} echo ran; echo rc=$?\n"
              "budget=$((SECONDS - started + STACKS_S + PART_MIN_S - 10))\n"
              f"within 200 {tmp_path / 'short.txt'} echo ran; echo rc=$?\n"
              f"within 25 {tmp_path / 'fits.txt'} echo ran; echo rc=$?\n")
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.stdout == "min=40\nrc=0\nrc=0\nrc=124\nrc=0\n", proc.stdout + proc.stderr
    assert re.fullmatch(r"ran\nacceptance: its limit cut by the budget from 200 s\nacceptance: exit status 0 after "
                        r"\d+ s\n", (tmp_path / "cut.txt").read_text())
    for name in ("own.txt", "fits.txt"):
        assert "cut" not in (tmp_path / name).read_text()
    assert (tmp_path / "short.txt").read_text().startswith("acceptance: out of time")


def test_what_a_run_ended_from_outside_left_running_the_next_run_ends(tmp_path):
    # The device tool ends a call at its limit, and a step in a session of its own outlives the run's shell: on a
    # warm machine the next call would share the GPU with it. Each step's session is noted as it starts, and the
    # next run ends them all before it starts anything.
    program = hanging_program(tmp_path, prints_stacks=False)
    sessions, part = tmp_path / "sessions", tmp_path / "part.txt"
    run = subprocess.Popen(["bash", "-c", f"started=$SECONDS\nsource {LIMITS}\nbudget=$((STACKS_S + 300))\n"
                            f"STEP_SESSIONS={sessions}\nwithin 200 {part} python3 {program}\n"])
    try:
        deadline = time.monotonic() + 30
        while "child" not in (part.read_text() if part.exists() else "") and time.monotonic() < deadline:
            time.sleep(0.05)
        run.kill()  # as the device tool's end: no trap, no word
        run.wait(10)
        [step] = sessions.read_text().split()
        child = int(part.read_text().split("child ")[1].split()[0])
        assert alive(int(step)) and alive(child), "the run's step ended with it: nothing to test"
        proc = subprocess.run(["bash", "-c", f"source {LIMITS}\nend_sessions {sessions}"], timeout=30)
        assert proc.returncode == 0 and sessions.read_text() == ""
        deadline = time.monotonic() + 10
        while (alive(int(step)) or alive(child)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(int(step)) and not alive(child), "a step of the earlier run outlived the next run's start"
    finally:
        started = re.findall(r"child (\d+)", part.read_text() if part.exists() else "")
        started += sessions.read_text().split() if sessions.exists() else []
        for pid in started:
            if alive(int(pid)):
                os.kill(int(pid), 9)


def alive(pid: int) -> bool:
    """Whether the process runs (a zombie, ended but not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return False


def test_a_hung_check_is_named_with_its_top_frame_and_ends_its_rank(tmp_path):
    # rankcheck's per-check limit (RANKCHECK_LIMIT_S), which tests/gpu sets for every check on the GPU.
    program = tmp_path / "checks.py"
    program.write_text(
        "import sys, time\n"
        f"sys.path.insert(0, {str(REPO / 'tests' / 'ranks')!r})\n"
        "from rankcheck import check, run_all\n"
        "@check\ndef quick():\n    pass\n"
        "@check\ndef waits_forever():\n    time.sleep(600)\n"
        "run_all(0)\n"
    )
    proc = subprocess.run([sys.executable, str(program)], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "RANKCHECK_LIMIT_S": "1"})
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert f"HUNG rank=0 waits_forever after 1 s; top frame: {program}:9 in waits_forever" in proc.stdout, proc.stdout
    assert "most recent call first" in proc.stderr, proc.stderr


def test_a_selection_that_names_no_check_fails_and_says_so(tmp_path):
    # rankcheck's run_all(rank, only): a check renamed under a job that selects it must not pass as "checks=0".
    program = tmp_path / "checks.py"
    program.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(REPO / 'tests' / 'ranks')!r})\n"
        "from rankcheck import check, run_all\n"
        "@check\ndef quick():\n    pass\n"
        "run_all(0, sys.argv[1])\n"
    )
    ran = subprocess.run([sys.executable, str(program), "qui"], capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0 and "OK rank=0 checks=1" in ran.stdout, ran.stdout + ran.stderr
    proc = subprocess.run([sys.executable, str(program), "renamed"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FAIL rank=0 renamed: no check's name contains 'renamed'" in proc.stdout, proc.stdout
    # A selection is judged by the checks, not by how many ran: repeated zero times, it runs none and passes.
    env = {**os.environ, "RANKCHECK_REPEAT": "0"}
    none = subprocess.run([sys.executable, str(program), "qui"], capture_output=True, text=True, timeout=60, env=env)
    assert none.returncode == 0 and "OK rank=0 checks=0" in none.stdout, none.stdout + none.stderr


#: Errors that name a slip of our own scripts, never a missing GPU (a full rehearsal with UCC found cuda_ops.py
#: importing a misspelt name, 2026-12-05).
SLIPS = ("ImportError", "ModuleNotFoundError", "NameError", "AttributeError", "SyntaxError", "TypeError")


def rehearsal(tmp_path: Path, budget_s: int, **settings: str) -> tuple[Path, dict[str, str]]:
    """Where ``run`` rehearsed in ``tmp_path`` (its bundle, empty, in ``bundle``) writes (its $OUT), and its
    environment: nothing installed, the caller's UCC and hpccomm settings left out (but ``UCC_HOME`` where
    ``settings`` ask for the UCC installed here), the sessions of its steps noted in a file of its own."""
    (tmp_path / "bundle").mkdir()
    keep = "UCC_HOME" if "ACCEPTANCE_UCC" in settings else None
    env = {key: value for key, value in os.environ.items() if key == keep or not key.startswith(("UCC_", "HPCCOMM_"))}
    env.update(OUT=str(tmp_path / "out"), ACCEPTANCE_INSTALL="0", ACCEPTANCE_BUDGET_S=str(budget_s),
               CUDA_VISIBLE_DEVICES="", ACCEPTANCE_SESSIONS=str(tmp_path / "sessions"),
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", **settings)
    return tmp_path / "out", env


def rehearse(tmp_path: Path, budget_s: int, **settings: str) -> tuple[subprocess.CompletedProcess, str, str]:
    """``run`` here, without a GPU (:func:`rehearsal`): the run, its report and targets.md's "What failed or hung"
    section, once the checks that hold for any rehearsal pass: the five files are there, every target reads "not
    measured", and no part failed on a slip of ours."""
    out, env = rehearsal(tmp_path, budget_s, **settings)
    # The budget bounds the parts; what follows them (targets.md, the report, the tarball) takes seconds.
    proc = subprocess.run(["bash", str(SCRIPT), "run", str(tmp_path / "bundle")], capture_output=True, text=True,
                          timeout=budget_s + 120, env=env, cwd=REPO)
    assert sorted(path.name for path in out.iterdir()) == ["pytest-1.txt", "pytest-2.txt", "raw.tar.gz", "report.md",
                                                           "targets.md"], proc.stdout[-4000:] + proc.stderr[-2000:]
    report = (out / "report.md").read_text()
    assert report.startswith("# GPU acceptance ") and f"of a {budget_s} s budget" in report, report[-2000:]
    table, failed = (out / "targets.md").read_text().split("## What failed or hung")
    verdicts = [line.rsplit("|", 2)[-2].strip() for line in table.splitlines() if line.startswith("| ")][1:]
    assert len(verdicts) == 12 and set(verdicts) == {"not measured"}, table
    assert "MPI_ABORT" not in failed and "help message" not in failed, failed
    assert not [line for line in failed.splitlines() if any(slip in line for slip in SLIPS)], failed
    return proc, report, failed


def parts_ended(raw: Path) -> dict[str, int]:
    """{log: the second of the run at which its part ended}, from each part's last line in raw.tar.gz."""
    ended = {}
    with tarfile.open(raw) as logs:
        for member in logs.getmembers():
            text = logs.extractfile(member).read().decode(errors="replace") if member.isfile() else ""
            if found := re.findall(r"acceptance: exit status \d+ after (\d+) s", text):
                ended[Path(member.name).name] = int(found[-1])
    return ended


def assert_named_by_cause(failed: str, paths: tuple[str, ...], logs: tuple[str, ...] = ()) -> None:
    """Each staging floor, the benchmark on each of ``paths`` and each of ``logs`` (parts' logs) ended on torch's
    error, named with its rank."""
    parts = ("- floor-1.md: exit status 1: rank 0: ", "- floor-2.md: exit status 1: rank ",
             *(f"- benchmark, {path} path: exit 1 before its first cell: rank " for path in paths),
             *(f"- {log}: exit status 1: rank " for log in logs))
    for part in parts:
        line = next((line for line in failed.splitlines() if line.startswith(part)), None)
        assert line and "Error: " in line, (part, failed)


@needs_ucc
def test_run_ends_where_no_gpu_is_with_each_part_named_by_its_cause(tmp_path):
    # The half that runs on the GPU machine, rehearsed as CI can (docs/ucc-cuda.md, "Rehearsed on the CPU"),
    # installing nothing, with the UCC parts on hpccomm's UCC binding as installed here, for host memory
    # (ACCEPTANCE_UCC=installed): the diagnoses, the stages and the team-layer traces run as on the GPU machine,
    # each with its own settings. Every part fails at once here; the run must still end with its five files,
    # and targets.md must name each part's cause. The first such rehearsal (2026-12-04) found it saying "nothing
    # failed or hung" of crashed parts; a full one by hand with the prebuilt UCC found a misspelt import
    # (2026-12-05), which until this test no CI run could have.
    # Its parts took 65 s on a quiet 2-core machine and 99 s beside two CPU-bound processes (2026-12-05): a
    # budget of 300 s leaves every part its time on a busy CI machine.
    proc, report, failed = rehearse(tmp_path, 300, ACCEPTANCE_UCC="installed")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]  # both test passes: all skipped
    assert "paths staged ucc ucc-triggered; UCC as installed here" in report, report[:2000]
    assert failed.count("nothing failed or hung") == 2, failed  # the test passes, whose GPU tests skipped
    # UCX's own tools run (tests/build_ucc.sh gives them back the file modes the wheel's zip dropped).
    heading = "UCX transports and memory domains (ucx_info -d):"
    assert heading in report, report[:3000]
    assert "Transport:" in report.split(heading)[1].split("```")[0], report[:3000]
    # Each part that used CUDA ended on torch's error, named with its rank; none of them "nothing failed".
    lines = failed.splitlines()
    for diag in ("diag-stream.txt", "diag-nccl-alone.txt", "diag-triggered.txt", "diag-triggered-noncoop.txt",
                 "diag-triggered-noncoop-eager.txt"):
        # A diagnosis that found nothing would read "- diag-x.txt: nothing failed or hung".
        assert f"- {diag}:" in lines, failed
        cause = lines[lines.index(f"- {diag}:") + 1]
        assert cause.startswith("  - exit status 1: rank ") and "Error: " in cause, failed
    assert_named_by_cause(failed, ("staged", "ucc", "auto", "ucc-triggered"),
                          logs=("stages.txt", "ucc-trace.txt", "ucc-trace-nccl.txt"))
    # The first pass passed (its GPU tests skipped): the second came right after it, before the diagnoses.
    ended = parts_ended(tmp_path / "out" / "raw.tar.gz")
    assert ended["pytest-1.txt"] <= ended["pytest-2.txt"] <= ended["diag-stream.txt"], ended


def test_run_without_ucc_ends_with_each_part_named_or_skipped(tmp_path):
    # Without UCC: the staged path alone, as on a GPU machine where the bundle's UCC neither unpacks nor builds.
    # Where hpccomm has UCC, the test above has run every part of the staged path already, so this one, for CI's
    # time, runs on a budget too short for any step (none starts with under 15 s left past the 30 s a hung step's
    # stacks take): every probe and part is skipped, says so and is listed as such, the run still ends with its
    # five files, and its exit status is 1 (a test pass that did not run is no pass). Without UCC it runs the
    # staged path's parts in full.
    full = not binding.built()
    proc, report, failed = rehearse(tmp_path, 200 if full else 15)
    assert "paths staged; UCC none" in report, report[:2000]
    if full:
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]  # both test passes: all skipped
        assert failed.count("nothing failed or hung") == 2, failed
        assert_named_by_cause(failed, ("staged",))
        return
    assert proc.returncode == 1, proc.stdout[-4000:] + proc.stderr[-2000:]
    for part in ("- pass 1: did not run (no time left)", "- pass 2: did not run (no time left)",
                 "- compare.log: did not run (no time left)", "- floor-1.md: did not run (no time left)",
                 "- floor-2.md: did not run (no time left)"):
        assert part in failed, failed


def test_a_run_ended_by_sigterm_ends_its_step_and_leaves_what_it_has_in_out(tmp_path):
    # The device tool's limit is less than the call's where less device time is left (a second call on a fresh
    # machine): until 2026-12-06 such an end brought back only report.md's head. Now each part leaves targets.md,
    # the passes' logs and raw.tar.gz in $OUT as it ends, and a SIGTERM ends the step under way and writes them
    # once more. Here the first test pass hangs (a pytest plugin that sleeps), and the run gets SIGTERM there.
    (tmp_path / "hang_plugin.py").write_text(
        "import os, time\n"
        "def pytest_collection_finish(session):\n"
        "    open(os.environ['HANG_MARK'] + '.new', 'w').write(str(os.getpid()))\n"
        "    os.replace(os.environ['HANG_MARK'] + '.new', os.environ['HANG_MARK'])\n"
        "    time.sleep(600)\n"
    )
    out, env = rehearsal(tmp_path, 300)
    mark, scratch = tmp_path / "pytest.pid", tmp_path / "tmp"
    scratch.mkdir()
    env.update(PYTEST_PLUGINS="hang_plugin", PYTHONPATH=str(tmp_path), HANG_MARK=str(mark), TMPDIR=str(scratch))
    printed = tmp_path / "printed.txt"
    with printed.open("w") as sink:
        run = subprocess.Popen(["bash", str(SCRIPT), "run", str(tmp_path / "bundle")], stdout=sink,
                               stderr=subprocess.STDOUT, env=env, cwd=REPO)
    try:
        deadline = time.monotonic() + 200
        while not mark.exists() and run.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert mark.exists(), "the first test pass never started"
        hung = int(mark.read_text())
        # The parts before it have left their results already: the benchmark's part among them.
        assert (out / "targets.md").exists() and (out / "raw.tar.gz").exists(), sorted(os.listdir(out))
        start = time.monotonic()
        run.terminate()
        run.wait(60)
        assert run.returncode == 143 and time.monotonic() - start < 30, printed.read_text()[-3000:]
        assert not alive(hung), "the step under way outlived the run"
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
        if mark.exists() and alive(int(mark.read_text())):
            os.kill(int(mark.read_text()), 9)
    assert re.search(r"acceptance: ended by SIGTERM after \d+ s\n\Z", (out / "report.md").read_text())
    # targets.md names the pass as ended with the run, not as passed or hung.
    failed = (out / "targets.md").read_text().split("## What failed or hung")[1]
    assert "- pass 1 (pytest-1.txt):\n  - the part was ended with the run (SIGTERM: the device tool's limit)\n" \
        in failed, failed
    with tarfile.open(out / "raw.tar.gz") as raw:
        assert "./pytest-1.txt" in raw.getnames() and "./compare.log" in raw.getnames(), raw.getnames()
    # Its folder of raw logs went with it, as at a run's end (until 2026-12-06 one was left in /tmp each time).
    assert not list(scratch.glob("*/compare.log")), list(scratch.iterdir())
