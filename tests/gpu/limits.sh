# The GPU acceptance run's limits: tests/gpu/acceptance.sh's 'run' sources this (tests/test_gpu_acceptance.py
# too), with `set -e` off. Every part of the run, and every step of its set-up that can hang (what loads torch,
# MPI or UCC, the installs, UCC's fallback build), has a limit of its own. A step past it is ended with every
# process it started, after its Python programs print every thread's stack (those that print on SIGUSR1:
# rankcheck, the benchmarks, with_stacks.py; others, a compiler or pip's build, just end on it) and gdb adds
# the C stacks of those still there. Then a part's run goes on, as does a probe's; an install's ends the run
# (acceptance.sh). The parts (`within`) and the probes are also cut to what is left of the run's budget: they
# read $budget (seconds) and $started (bash's SECONDS at the run's start). Tools that start no Python
# (nvidia-smi, ucx_info, MPS's control) keep plain `timeout`s; what cannot hang (tar, cp, targets.py on the
# logs) has none.

limits_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PROBE_S=60  # a set-up probe: torch, MPI or UCC loading (their loads took seconds on the H100)

native_stacks() {  # session: every Python process's C stacks, where gdb is here (a hang inside a C library)
  local sid=$1 pids p readers=()
  [ -n "$sid" ] || return 0
  if ! command -v gdb >/dev/null; then echo "acceptance: no gdb here: no native stacks"; return 0; fi
  pids=$(pgrep -s "$sid" python)
  for p in $pids; do
    { echo "acceptance: native stack of pid $p ($(tr '\0' ' ' <"/proc/$p/cmdline" | cut -c1-80))"
      timeout 20 gdb -p "$p" -batch -nx -ex "thread apply all bt 25" 2>&1 | grep -E "^(Thread|#)"
    } >"/tmp/native.$p" &
    readers+=($!)
  done
  [ ${#readers[@]} -eq 0 ] || wait "${readers[@]}"  # these alone: the hung step is a child of this shell too
  for p in $pids; do cat "/tmp/native.$p"; rm -f "/tmp/native.$p"; done
}

bounded() {  # seconds command...: run it, its output where the caller's goes, at most `seconds`; status 124 past them
  # In a session of its own, so that a step past its limit is ended with every process it started (mpirun's
  # ranks included), after SIGUSR1, on which rankcheck, the benchmarks and with_stacks.py print every thread's
  # stack; the C stacks follow where gdb is. Its own lines go to stderr, after the step's.
  local limit=$1 pid native rc; shift
  local -; set +m  # without job control a background job leads no process group, so setsid does not fork
  setsid "$@" &
  pid=$!
  # Its session is the one it leads once setsid has run in it (its id is its pid): until then, no clock.
  until [ "$(ps -o sid= -p "$pid" | tr -d ' ')" = "$pid" ] || ! kill -0 "$pid" 2>/dev/null; do sleep 0.01; done
  local deadline=$((SECONDS + limit))
  while kill -0 "$pid" 2>/dev/null && [ $SECONDS -lt $deadline ]; do sleep 0.1; done
  if kill -0 "$pid" 2>/dev/null; then
    # Not bash's notice of the step's end by these signals ("Killed", printed as the next command ends): the
    # HUNG line says it.
    { pkill -USR1 -s "$pid"; sleep 5; } 2>/dev/null
    native=$(native_stacks "$pid" 2>&1)
    { pkill -KILL -s "$pid"; wait "$pid"; } 2>/dev/null
    rc=124
    [ -z "$native" ] || echo "$native" >&2
    echo "acceptance: HUNG: still running at its ${limit} s limit (stacks above, where the program prints them)" >&2
  else
    wait "$pid"; rc=$?
  fi
  return $rc
}

within() {  # seconds file command...: a part of the run, into file, at most `seconds` and what is left of the budget
  local limit=$1 file=$2 left=$((budget - (SECONDS - started))) rc; shift 2
  if [ "$left" -lt 15 ]; then echo "acceptance: out of time (budget ${budget} s), skipped: $*" >"$file"; return 124; fi
  [ "$limit" -le "$left" ] || limit=$left
  bounded "$limit" "$@" >"$file" 2>&1
  rc=$?
  echo "acceptance: exit status $rc after $((SECONDS - started)) s" >>"$file"
  return $rc
}

python_step() {  # seconds python3-arguments...: a set-up step in Python (-c CODE or -m MODULE ...), bounded,
  # printing every thread's stack past its limit (with_stacks.py)
  local limit=$1; shift
  bounded "$limit" python3 "$limits_dir/with_stacks.py" "$@"
}

setup_step() {  # seconds python3-arguments...: python_step, its stderr into $setup_log (the run's set-up.txt;
  # stderr where none is set) after a line naming it, and a line with its exit status where that is not 0, so
  # that targets.py reads each step there as a part's log and names every one that hung or failed.
  local limit=$1 log rc; shift
  setup_log_open log
  echo "acceptance: set-up: python3 $*" >&"$log"
  python_step "$limit" "$@" 2>&"$log"
  rc=$?
  [ "$rc" = 0 ] || echo "acceptance: exit status $rc after $((SECONDS - ${started:-0})) s" >&"$log"
  exec {log}>&-
  return $rc
}

setup_log_open() {  # variable: a new descriptor, in that variable, onto $setup_log (appended to, each step's
  # lines on a line of their own) or, where none is set, onto stderr as it is
  if [ -n "${setup_log:-}" ]; then
    # A step's stderr that ended without a newline would glue the next step's line onto its last.
    [ ! -s "$setup_log" ] || [ "$(tail -c 1 "$setup_log" | wc -l)" = 1 ] || echo >>"$setup_log"
    eval "exec {$1}>>\"\$setup_log\""  # eval: bash takes {name} only as written
  else
    eval "exec {$1}>&2"
  fi
}

probe() {  # python3 ARGS (-c or -m): a set-up step at most $PROBE_S and what is left of the budget (where
  # torch's CUDA set-up hangs, every probe that asks torch for a GPU does), seeing hpccomm as the parts' programs
  # do: the installed one. Without PYTHONSAFEPATH, `python3 -c` and `-m` import this checkout's sources first,
  # which a non-editable install (CI's rehearsal) leaves without their compiled extensions. Like a part, it
  # starts only with 15 s left: with less, loading torch alone could outlast it, and a probe ended that early
  # would read as a hang.
  local left=$((budget - (SECONDS - started))) log
  if [ "$left" -lt 15 ]; then
    setup_log_open log
    printf 'acceptance: set-up: python3 %s\nacceptance: out of time (budget %s s), skipped\n' "$*" "$budget" >&"$log"
    exec {log}>&-
    return 124
  fi
  PYTHONSAFEPATH=1 setup_step $((left < PROBE_S ? left : PROBE_S)) "$@"
}
