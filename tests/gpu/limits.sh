# The GPU acceptance run's limits: tests/gpu/acceptance.sh's 'run' sources this (tests/test_gpu_acceptance.py
# too), with `set -e` off. Every part of the run, and every step of its set-up that can hang (what loads torch,
# MPI or UCC, the installs, UCC's fallback build), has a limit of its own. A step past it is ended with every
# process it started, whatever their sessions, after its Python programs that print every thread's stack on
# SIGUSR1 (rankcheck, the benchmarks, with_stacks.py) have printed it (no other process gets the signal: it
# would end on it) and gdb has added the C stacks of every process that started none (a rank of ucc_perftest or
# of a rank program) and of the other Python ones. Then a part's run goes on, as does a probe's; an install's
# ends the run (acceptance.sh). Every limit is also cut to what is left of the run's budget (`budget_cut`: it
# reads $budget, seconds, and $started, bash's SECONDS at the run's start), less the time a step past its limit
# takes to show its stacks (STACKS_S), so that a slow set-up leaves the parts less time, never the call's end
# past the budget (the report after it takes seconds), and none starts with under MIN_STEP_S (15 s) of it left:
# `bounded` does not start it, and says so on its stderr (a part's log, set-up.txt). Tools that start no
# Python (nvidia-smi, ucx_info, MPS's control) keep plain `timeout`s (MPS's quit, after its parts, may end up to
# 20 s past the budget); what cannot hang (tar, cp, targets.py on the logs) has none.

limits_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PROBE_S=60  # a set-up probe: torch, MPI or UCC loading (their loads took seconds on the H100)

NATIVE_MAX=16  # processes whose C stacks gdb reads past a limit (at once): a build's compilers are many
DUMP_S=5  # a step past its limit: its Python processes' time to print their stacks on SIGUSR1
# What reads the C stacks: gdb, else cuda-gdb (the GPU machine has no gdb; its cuda-gdb attaches to programs), else
# nothing, and no time is kept for it.
DEBUGGER=$(command -v gdb || command -v cuda-gdb || true)
[ -n "$DEBUGGER" ] || [ ! -x /usr/local/cuda/bin/cuda-gdb ] || DEBUGGER=/usr/local/cuda/bin/cuda-gdb
GDB_S=20  # then its time to read the C stacks (every process at once; SIGKILL 3 s later, as a hung ptrace may need)
[ -n "$DEBUGGER" ] || GDB_S=0
# What a step past its limit takes after it to show where it stood (gdb's kill and the step's own included):
# budget_cut keeps it out of a step's limit, so that a step ended at the budget's end has shown its stacks by then.
STACKS_S=$((DUMP_S + GDB_S + 5))
# No step starts with less of the budget left: loading torch alone could outlast it, and a step ended that early
# would read as a hang.
MIN_STEP_S=15
# Nor does a part (`within`) start with less than this, or its own limit where that is less: a rank job's start
# (MPI, torch, CUDA, UCC) takes seconds, a test pass's first check more, and a pass given 20 s would be ended in
# its first checks, its results read as hung. The parts' own limits are 25-200 s.
PART_MIN_S=40
# Where set, each step's session is noted in this file as it starts, so that a later run on the same machine can
# end what a run ended from outside left behind (acceptance.sh: end_sessions).
STEP_SESSIONS=${STEP_SESSIONS:-}
# The session of the step under way (`bounded`), empty between steps: end_step ends it. And the log of the part
# under way (`within`), for a note of how it ended where the run is ended from outside.
STEP=
PART_LOG=

process_table() {  # "pid ppid session" of every process, read from /proc: the GPU machine's image may have no
  # procps (no ps, no pkill; not checked there), and a limit that waited on `ps` for a step's session would never
  # start its clock
  local f fields state ppid pgrp sid
  for f in /proc/[0-9]*/stat; do
    { read -r fields <"$f"; } 2>/dev/null || continue  # ended since the glob
    # Past the command's name, which may hold spaces and parentheses: state, ppid, process group, session.
    read -r state ppid pgrp sid _ <<<"${fields##*") "}"
    echo "${f//[^0-9]/} $ppid $sid"
  done
}

session_of() {  # pid: its session's id; nothing where it has ended
  local fields state ppid pgrp sid
  { read -r fields <"/proc/$1/stat"; } 2>/dev/null || return 0
  read -r state ppid pgrp sid _ <<<"${fields##*") "}"
  echo "$sid"
}

session_members() {  # sid: the processes of that session (Linux gives no new process that id while one is left)
  process_table | awk -v sid="$1" '$3 == sid { print $1 }'
}

step_processes() {  # pid: the step's processes, in pid order: it, every process it started, whatever their session
  # (tests/launch.py starts each rank job in a session of its own), and any other of its session
  process_table | awk -v root="$1" '
    { parent[$1] = $2; session[$1] = $3 }
    END {
      for (p in parent) {
        q = p; hops = 0
        while (q != root && (q in parent) && hops++ < 64) q = parent[q]
        if (q == root || session[p] == root) print p
      }
    }' | sort -n
}

python_process() {  # pid: whether it runs Python (by its executable: a console script's name is not python's)
  [[ $(readlink "/proc/$1/exe" 2>/dev/null) == */python* ]]
}

catches_usr1() {  # pid: whether it handles SIGUSR1 (faulthandler's dump of every thread) instead of ending on it
  local mask
  mask=$(awk '/^SigCgt:/ { print $2 }' "/proc/$1/status" 2>/dev/null)
  [ -n "$mask" ] && (( (0x$mask >> 9) & 1 ))  # SIGUSR1 is signal 10
}

native_stacks() {  # pid...: the C stacks, where gdb is here, of those that started none of them (a rank of
  # ucc_perftest or of a rank program, a compiler; not `sleep`), then of the other Python ones, NATIVE_MAX at most:
  # where a hang inside a C library (UCC, CUDA, MPI) stands
  local p readers=() dir parents leaves=() python=() chosen
  [ $# -gt 0 ] || return 0
  if [ -z "$DEBUGGER" ]; then echo "acceptance: no gdb here (nor cuda-gdb): no native stacks"; return 0; fi
  parents=" $(process_table | awk -v listed=" $* " 'index(listed, " " $1 " ") { printf "%s ", $2 }') "
  for p in "$@"; do
    if [[ $parents != *" $p "* ]]; then
      [ "$(cat "/proc/$p/comm" 2>/dev/null)" = sleep ] || leaves+=("$p")
    elif python_process "$p"; then
      python+=("$p")
    fi
  done
  chosen=("${leaves[@]}" "${python[@]}")
  chosen=("${chosen[@]:0:NATIVE_MAX}")
  dir=$(mktemp -d)
  for p in "${chosen[@]}"; do
    { echo "acceptance: native stack of pid $p ($(tr '\0' ' ' <"/proc/$p/cmdline" | cut -c1-80))"
      timeout -k 3 "$GDB_S" "$DEBUGGER" -p "$p" -batch -nx -ex "thread apply all bt 25" 2>&1 | grep -E "^(Thread|#)"
    } >"$dir/$p" &
    readers+=($!)
  done
  [ ${#readers[@]} -eq 0 ] || wait "${readers[@]}"  # these alone: the hung step is a child of this shell too
  for p in "${chosen[@]}"; do cat "$dir/$p"; done
  rm -rf "$dir"
}

bounded() {  # seconds command...: run it, its output where the caller's goes, at most `seconds`; status 124 past them
  # In a session of its own; a step past its limit is ended with every process it started (mpirun's ranks
  # included, and rank jobs in sessions of their own), after SIGUSR1 to those of its Python processes that print
  # every thread's stack on it (rankcheck, the benchmarks, with_stacks.py); the C stacks follow where gdb is.
  # Its own lines go to stderr, after the step's.
  local limit=$1 pid native rc procs stacking; shift
  if ! [[ $limit =~ ^[0-9]+$ ]] || [ "$limit" -eq 0 ]; then  # none of the budget left (budget_cut), or no limit
    echo "acceptance: out of time (budget ${budget:-unset} s), not started: $*" >&2
    return 124
  fi
  local -; set +m  # without job control a background job leads no process group, so setsid does not fork
  setsid "$@" &
  pid=$!
  # Its session is the one it leads once setsid has run in it (its id is its pid): until then, no clock.
  until [ "$(session_of "$pid")" = "$pid" ] || ! kill -0 "$pid" 2>/dev/null; do sleep 0.01; done
  STEP=$pid
  [ -z "$STEP_SESSIONS" ] || echo "$pid" >>"$STEP_SESSIONS"
  local deadline=$((SECONDS + limit))
  while kill -0 "$pid" 2>/dev/null && [ $SECONDS -lt $deadline ]; do sleep 0.1; done
  if kill -0 "$pid" 2>/dev/null; then
    # Its processes, taken before any signal: one that ended would leave its children to init, out of reach.
    procs=$(step_processes "$pid")
    # SIGUSR1 to those that print their stacks on it: any other would end on it before gdb could read its C
    # stack, and mpirun would pass it on to its ranks a second time. Not bash's notice of the step's end by
    # these signals ("Killed", printed as the next command ends): the HUNG line says it.
    stacking=$(for p in $procs; do python_process "$p" && catches_usr1 "$p" && echo "$p"; done)
    if [ -n "$stacking" ]; then { kill -USR1 $stacking; sleep "$DUMP_S"; } 2>/dev/null; fi
    # shellcheck disable=SC2086
    native=$(native_stacks $procs 2>&1)
    # shellcheck disable=SC2086
    # Then any process of its session started since they were taken.
    # shellcheck disable=SC2046
    { kill -KILL $procs; kill -KILL $(session_members "$pid"); wait "$pid"; } 2>/dev/null
    rc=124
    [ -z "$native" ] || echo "$native" >&2
    echo "acceptance: HUNG: still running at its ${limit} s limit (stacks above, where the program prints them)" >&2
  else
    wait "$pid"; rc=$?
  fi
  STEP=
  return $rc
}

end_session() {  # sid: every process of that session and every process they started
  local procs
  procs=$(step_processes "$1")
  # shellcheck disable=SC2086
  [ -z "$procs" ] || kill -KILL $procs 2>/dev/null
}

end_step() {  # why: the step under way, with all it started (a run ended from outside: acceptance.sh's trap), and
  # a line in the log of the part under way saying why (targets.py reads it)
  [ -z "$STEP" ] || end_session "$STEP"
  [ -z "$PART_LOG" ] || echo "acceptance: ended by $1, the run with it, after $((SECONDS - started)) s" >>"$PART_LOG"
}

end_sessions() {  # file: end every session noted in it (STEP_SESSIONS: steps of an earlier run), then empty it
  local sid
  [ -f "$1" ] || return 0
  while read -r sid; do
    [ -n "$sid" ] || continue
    if [ "$(session_of "$sid")" = "$sid" ]; then  # its leader still runs: it and all it started
      end_session "$sid"
    else  # what is left of its session (its id, once its leader ended, may be another process's)
      # shellcheck disable=SC2046
      kill -KILL $(session_members "$sid") 2>/dev/null
    fi
  done <"$1"
  : >"$1"
}

budget_cut() {  # seconds: the smaller of them and what is left of the run's budget less STACKS_S; 0 where that
  # is under MIN_STEP_S (the caller does not start its step)
  local left=$((budget - (SECONDS - started) - STACKS_S))
  [ "$left" -ge "$MIN_STEP_S" ] || left=0
  echo $((left < $1 ? left : $1))
}

within() {  # seconds file command...: a part of the run, into file, at most `seconds` and what is left of the budget;
  # not started with less left than PART_MIN_S or `seconds`, whichever is less
  local own=$1 limit file=$2 rc; limit=$(budget_cut "$1"); shift 2
  [ "$limit" -ge $((own < PART_MIN_S ? own : PART_MIN_S)) ] || limit=0
  PART_LOG=$file
  bounded "$limit" "$@" >"$file" 2>&1  # with no time left, its refusal is the log
  rc=$?
  PART_LOG=
  # A part ended at a limit the budget cut is not known to hang (targets.py reads this line).
  [ "$limit" = 0 ] || [ "$limit" -ge "$own" ] || echo "acceptance: its limit cut by the budget from $own s" >>"$file"
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
  # that targets.py reads each step there as a part's log and names every one that hung, failed or, given no
  # time (a limit of 0: budget_cut), did not run.
  local limit=$1 log rc; shift
  setup_log_open log
  echo "acceptance: set-up: python3 $*" >&"$log"
  python_step "$limit" "$@" 2>&"$log"  # with no time left, bounded's refusal is the step's part
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
  # which a non-editable install (CI's rehearsal) leaves without their compiled extensions. Like every step,
  # it starts only with MIN_STEP_S of the budget left (budget_cut), and where it does not, says so in set-up.txt.
  PYTHONSAFEPATH=1 setup_step "$(budget_cut "$PROBE_S")" "$@"
}
