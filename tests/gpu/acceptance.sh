#!/usr/bin/env bash
# The GPU acceptance command, in two halves.
#
#   bash tests/gpu/acceptance.sh prepare [DIR] [UCC_SOURCE]   here (with PyPI): what the GPU machine cannot
#                                                              download, into DIR (default .gpu-bundle, git-ignored)
#   bash tests/gpu/acceptance.sh run [DIR]                     on the GPU machine, through the device tool:
#       run(command="bash tests/gpu/acceptance.sh run", carry=[".gpu-bundle"], timeout_s=420)
#
# UCC_SOURCE: an autogen'd UCC source tarball (one top directory, as ../shared/ucc/ucc-1.8.0-autogen.tar.gz),
# bundled as it is; or a UCC source checkout (a git clone of openucx/ucc, e.g. of the mirror `fetch
# github:openucx/ucc` brings: git clone /work/.mirror/openucx+ucc/repo /tmp/ucc), whose autogen.sh 'prepare'
# runs here (the GPU machine has no libtoolize) before bundling the generated tree. Not given: the tarball
# .ci/run builds UCC from ($HPCCOMM_UCC_SOURCE, else ../shared/ucc/ucc-1.8.0-autogen.tar.gz beside this
# checkout, else /work/shared/ucc/...), where found. With UCC the bundle holds a libucx-cu13 wheel too (UCX with
# CUDA); without, 'run' tests the staged path alone. Bundle: 53.7 MB with UCC (the UCX wheel 43.4 MB; carry
# limit 64 MiB with the working tree, 1.9 MB).
#
# 'prepare' also builds UCC here for the GPU machine (tests/gpu/prebuild_ucc.sh: CUDA 13.0, sm_90, tl/nccl,
# tl/cuda, ucc_perftest on Open MPI 4.1; about 2 minutes, 2 MB; HPCCOMM_PREBUILD_UCC=0 leaves it out), so
# that 'run' unpacks it in a second instead of building it there (130-150 s of device time; tests/build_ucc.sh
# stays the fallback when the bundle has no prebuilt UCC).
#
# The GPU machine (../shared/FACTS.md) has a Python 3.12 venv with torch (CUDA) and mpi4py on the system
# Open MPI, and no network. 'run' unpacks (or builds) UCC into a clean /tmp/hpccomm-ucc, installs hpccomm
# against it from this checkout (no dependencies fetched), prints the machine and the one UCC environment every
# part runs with (UCC_CL_BASIC_TLS=^nccl where two ranks share one GPU, which NCCL refuses), then runs, in
# order of worth, each part in a session of its own with its own limit, cut to what is left of
# ACCEPTANCE_BUDGET_S (default 380 s, set-up included, so that a call with a fresh machine's start stays under
# 8 minutes and a session can run it twice); a part past its limit gets SIGUSR1 in those of its Python programs
# that print every thread's stack on it (rankcheck, the benchmarks; a rank program under pytest prints into
# the pass's ranks-N/ as it comes: tests/launch.py's RANK_JOB_LOGS), and where gdb is (else cuda-gdb: the GPU
# machine has no gdb), the C stacks of every process that started none (ucc_perftest's ranks, a rank program) and
# of the other Python ones follow; then it is ended with every process it started, rank jobs in sessions of their
# own included, and the run goes on (tests/gpu/limits.sh, which reads processes from /proc: no procps needed). A
# part starts only with 40 s of the budget left, or its own limit where that is less; one ended at a limit the
# budget cut is named as such in targets.md, not as hung. After each part, targets.md, the test passes' logs and
# raw.tar.gz are written to $OUT as they stand, so that a call the device tool ends early (its limit is less where
# less device time is left: set ACCEPTANCE_BUDGET_S below it) still brings them back; a SIGTERM ends the step under
# way and writes them once more. A run first ends what an earlier one on the same machine left running.
# The set-up's steps that can hang have limits too, their Python ones printing their stacks through
# tests/gpu/with_stacks.py: a probe that hung, failed or had no time left is named in targets.md (set-up.txt)
# and the run goes on; an install past its limit ends the run, its log (stacks included) printed. Every limit,
# the set-up's too, is cut to what is left of the budget less the 30 s a hung step's stacks take, and none starts
# with under 15 s of that left, so that the call ends within the budget and the report's few seconds.
# The parts, in order:
#   1. ucc_perftest all-reduce on CUDA memory, out of place and in place (UCC's own numbers), and out of place
#      with UCX's memory-type cache off, as hpccomm runs UCX;
#   2. benchmarks/cuda_allreduce.py --compare: every path against Gloo, per collective and size (each job
#      bounded), and the staged limit to set;
#   2b. benchmarks/cuda_call_stages.py: where a UCC all-reduce's time goes, timed as ucc_perftest times and
#      back to back (stages.txt; again under MPS in 5);
#   3. tests/gpu, first pass: every path (staged, ucc, ucc-triggered, mpi where the MPI is CUDA-aware), each
#      check bounded (60 s: a hung check prints HUNG with its top frame and ends its job);
#   4. the H100's failures, each alone (diag-*.txt): the compute stream on a fresh process, a lone rank with
#      tl/nccl let into the team, the triggered path's first all-reduces (as hpccomm runs them; with UCC's
#      default executor launch; that with every kernel loaded at start; under MPS);
#   5. with MPS on, where the machine has nvidia-cuda-mps-control: ucc_perftest and the paths again;
#   6. tests/gpu, second pass (where the first passed, right after it, before 4 and 5: the target needs both);
#   7. the staging floor at one rank (with a cProfile), the team layer of each collective (UCC_COLL_TRACE, without
#      and with tl/nccl), the staging floor at two ranks.
# ACCEPTANCE_PATHS (e.g. "staged ucc") limits the hpccomm paths of 2, 3 and 6; ACCEPTANCE_MPS=0 skips 5;
# ACCEPTANCE_INSTALL=0 installs nothing (hpccomm and the bundle's wheels as they are: CI's rehearsal, without a
# GPU); ACCEPTANCE_UCC=installed, where the bundle has no UCC or its UCC neither unpacks nor builds, runs the UCC
# parts on hpccomm's UCC binding as installed here (CI's rehearsal of the diagnoses, on a UCC for host memory).
# Into $OUT (default ./gpu-out), five files: targets.md (tests/gpu/targets.py: PASS, SHORT or "not measured"
# per target, every ratio from this run, every check that failed or hung with its top frame, and every other
# part that failed, hung or had no time left, with the error its output names or its top frame; each set-up
# step in Python too), report.md (the machine, UCC's components and environment, UCX's transports, what the
# set-up's probes printed on stderr, every table above), pytest-1.txt and
# pytest-2.txt, raw.tar.gz (every log and JSON; ranks-1/ and ranks-2/, each rank job's output of the two
# passes as it came, which outlives a pass ended at its limit); install.log too where an install failed (the run
# ends there). A part the budget leaves no time for says so in its log. report.md names the commit from the
# bundle's source.txt ('prepare' writes it; a failed UCC prebuild fails 'prepare').
# Exit status: that of the test passes.
# Rehearse 'run' on the CPU before a GPU session (docs/ucc-cuda.md, "Rehearsed on the CPU"): every part fails
# fast there, and targets.md must name each one's cause.
set -euo pipefail
cd "$(dirname "$0")/../.."
mode=${1:-}
bundle=${2:-.gpu-bundle}

case "$mode" in
prepare)
  mkdir -p "$bundle/wheels"
  # cffi builds hpccomm's C extensions; pytest runs tests/gpu, pytest-timeout bounds each item as pyproject.toml
  # says. For the GPU machine's CPython 3.12.
  python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$bundle/wheels" cffi pytest pytest-timeout
  ls "$bundle/wheels"/cffi-*-cp312-*.whl "$bundle/wheels"/pytest-*.whl "$bundle/wheels"/pytest_timeout-*.whl >/dev/null
  # UCC: the source given, else the shared autogen'd tarball, found as .ci/run finds it.
  ucc_src=${3:-${HPCCOMM_UCC_SOURCE:-}}
  for candidate in ../shared/ucc/ucc-1.8.0-autogen.tar.gz /work/shared/ucc/ucc-1.8.0-autogen.tar.gz; do
    if [ -z "$ucc_src" ] && [ -f "$candidate" ]; then ucc_src=$candidate; fi
  done
  if [ -n "$ucc_src" ]; then
    # UCX with CUDA 13 transports, for the GPU machine's CUDA 13.
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
      --platform manylinux_2_28_x86_64 -d "$bundle/ucx" "libucx-cu13==1.22.0"
  fi
  if [ -f "$ucc_src" ]; then
    # An autogen'd tarball goes as it is (tests/build_ucc.sh unpacks it there).
    tar -tzf "$ucc_src" | grep '^[^/]*/configure$' >/dev/null \
      || { echo "$ucc_src has no configure script in its top directory: not autogen'd" >&2; exit 1; }
    cp "$ucc_src" "$bundle/ucc-source.tar.gz"
  elif [ -n "$ucc_src" ]; then
    # A git checkout: autogen'd here, where libtoolize is.
    work=$(mktemp -d)
    git -C "$ucc_src" archive --format=tar --prefix=ucc/ HEAD | tar -x -C "$work"
    # configure.ac numbers the build with `git rev-list`: give the archive the count autogen would read.
    count=$(git -C "$ucc_src" rev-list HEAD | wc -l)
    sed -i "s|esyscmd(\[sh -c \"git rev-list HEAD .*\"\])|$count|" "$work/ucc/configure.ac"
    (cd "$work/ucc" && ./autogen.sh >"$work/autogen.log" 2>&1) || { tail -20 "$work/autogen.log"; exit 1; }
    tar -czf "$bundle/ucc-source.tar.gz" -C "$work" ucc
    rm -rf "$work"
  fi
  # UCC built here for the GPU machine (tests/gpu/prebuild_ucc.sh, about 2 minutes, needs PyPI and mpicc): 'run'
  # unpacks it instead of building it there (130-150 s of device time, which leaves the parts too little of the
  # budget: a failed prebuild fails 'prepare'). HPCCOMM_PREBUILD_UCC=0 leaves it out, and 'run' builds UCC there.
  rm -f "$bundle/ucc-prebuilt.tar.gz"
  if [ -f "$bundle/ucc-source.tar.gz" ] && [ "${HPCCOMM_PREBUILD_UCC:-1}" != 0 ]; then
    bash tests/gpu/prebuild_ucc.sh "$bundle" "$bundle/ucc-source.tar.gz" \
      || { echo "UCC prebuild failed (HPCCOMM_PREBUILD_UCC=0: 'run' builds UCC on the GPU machine)" >&2; exit 1; }
  fi
  # The device tool copies the working tree without its history: report.md names the commit from here.
  echo "$(git log -1 --format='%h %ad %s' --date=short | cut -c1-100)$([ -z "$(git status --porcelain \
    --untracked-files=no)" ] || echo ' (with uncommitted changes)')" >"$bundle/source.txt"
  echo "prepared $bundle: $(cd "$bundle" && find . -type f | sort | tr '\n' ' ')"
  du -sh "$bundle"
  ;;
run)
  set +e  # every part runs and reports; the exit status is the test passes'
  out=${OUT:-$PWD/gpu-out}
  work=$(mktemp -d)  # everything raw; $OUT gets the five files the header names
  mkdir -p "$out"
  started=$SECONDS
  budget=${ACCEPTANCE_BUDGET_S:-380}
  source tests/gpu/limits.sh  # within (a part); python_step, setup_step and probe (the set-up): each a limit
  # What an earlier run on this machine left (a call the device tool ended, rerun while the machine was warm): the
  # sessions of its steps (limits.sh notes each in $STEP_SESSIONS), and MPS's daemon, ended before anything starts.
  STEP_SESSIONS=${ACCEPTANCE_SESSIONS:-/tmp/hpccomm-acceptance.sessions}  # a rehearsal's own (tests run side by side)
  end_sessions "$STEP_SESSIONS"
  if [ -d /tmp/hpccomm-mps/pipe ] && command -v nvidia-cuda-mps-control >/dev/null; then
    echo quit | CUDA_MPS_PIPE_DIRECTORY=/tmp/hpccomm-mps/pipe timeout 20 nvidia-cuda-mps-control >/dev/null 2>&1
  fi
  rm -rf /tmp/hpccomm-mps
  checkpoint() {  # what the run has so far, into $OUT: the device tool may end the call before the report (its
    # limit is less where less device time is left), and then targets.md and raw.tar.gz still come back
    cp "$work"/pytest-*.txt "$out/" 2>/dev/null
    if ! python3 tests/gpu/targets.py "$work" >"$out/targets.md" 2>"$work/targets-error.txt"; then
      echo "tests/gpu/targets.py failed (raw.tar.gz: targets-error.txt): $(tail -n 1 "$work/targets-error.txt")" \
        >>"$out/targets.md"
    fi
    tar -czf "$out/raw.tar.gz" -C "$work" . 2>/dev/null
  }
  part() {  # seconds file command...: a part of the run (limits.sh's within), then what the run has so far
    local rc
    within "$@"
    rc=$?
    checkpoint
    return $rc
  }
  # Ended from outside (the device tool at its limit): the step under way ended with all it started, then what
  # the run has so far (raw.tar.gz holds every log), and a line saying so in report.md.
  trap 'end_step SIGTERM; echo "acceptance: ended by SIGTERM after $((SECONDS - started)) s" >>"$out/report.md"
        checkpoint; rm -rf "$work"; exit 143' TERM
  install=${ACCEPTANCE_INSTALL:-1}  # 0: hpccomm and the wheels as installed here (tests/test_gpu_acceptance.py)
  # The set-up has limits too, printing its stacks past them as the parts do: a probe 60 s (torch, MPI or UCC
  # loading), the wheels' install 120 s, the UCX wheel's unzip 60 s, hpccomm's install (its C extensions built)
  # and UCC's fallback build 300 s each; each of them, or what is left of the budget where that is less, so
  # that a slow set-up leaves the parts less time, and the whole call ends within the budget and the report.
  # An install that fails or hangs ends the run with its log.
  [ "$install" = 0 ] || python_step "$(budget_cut 120)" -m pip install -q --no-index --find-links "$bundle/wheels" \
    cffi pytest pytest-timeout \
    >"$work/install.log" 2>&1 || { cp "$work/install.log" "$out/"; cat "$work/install.log"; exit 1; }
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  # Each Python step of the set-up (probes, the UCX wheel's unzip) writes its stderr to set-up.txt under a line
  # naming it (limits.sh's setup_step; a hung one: its stacks), which report.md shows and targets.md reads.
  setup_log=$work/set-up.txt
  gpus=$(probe -c 'import torch; print(torch.cuda.device_count())')
  gpus=${gpus:-0}
  paths="staged"
  ucc_from=none ucc_env=""
  if [ -f "$bundle/ucc-prebuilt.tar.gz" ] && ls "$bundle"/ucx/libucx_cu13-*.whl >/dev/null 2>&1; then
    # Built on the CPU machine (tests/gpu/prebuild_ucc.sh) into this very path: unpacked into a clean prefix.
    rm -rf /tmp/hpccomm-ucc && mkdir -p /tmp/hpccomm-ucc/ucx
    if tar -xzf "$bundle/ucc-prebuilt.tar.gz" -C /tmp/hpccomm-ucc \
        && setup_step "$(budget_cut 60)" -m zipfile -e "$bundle"/ucx/libucx_cu13-*.whl /tmp/hpccomm-ucc/ucx \
        && cp /tmp/hpccomm-ucc/ucc-env.sh "$work/ucc-env.sh"; then
      ucc_from="prebuilt ($(head -n 1 /tmp/hpccomm-ucc/PREBUILT))" ucc_env=$work/ucc-env.sh
    fi
  fi
  if [ "$ucc_from" = none ] && [ -f "$bundle/ucc-source.tar.gz" ]; then
    # The fallback: built here (about 130-150 s), into a clean prefix (build_ucc.sh clears its own).
    rm -rf /tmp/hpccomm-ucc
    if bounded "$(budget_cut 300)" bash tests/build_ucc.sh --cuda --nccl "$bundle/ucc-source.tar.gz" \
        "$bundle"/ucx/libucx_cu13-*.whl /tmp/hpccomm-ucc \
        >"$work/ucc-env.sh" 2>"$work/ucc-build.txt"; then
      ucc_from="built here in $((SECONDS - started)) s" ucc_env=$work/ucc-env.sh
    else
      echo "UCC build failed: $(tail -n 1 "$work/ucc-build.txt") (raw.tar.gz: ucc-build.txt)"
    fi
  fi
  if [ "$ucc_from" = none ] && [ "${ACCEPTANCE_UCC:-}" = installed ]; then
    # CI's rehearsal: hpccomm's UCC binding as installed here, with the caller's UCC_HOME and LD_LIBRARY_PATH.
    if [ "$(probe -c 'import hpccomm.ucc.binding as b; print(b.built())')" = True ]; then
      ucc_from="as installed here (UCC_HOME=${UCC_HOME:-unset})"
    else
      echo "ACCEPTANCE_UCC=installed, but hpccomm here has no UCC binding (or its probe failed: set-up.txt)"
    fi
  fi
  [ "$ucc_from" != none ] || echo "no UCC: testing the staged path alone"
  if [ "$ucc_from" != none ]; then
    if [ -n "$ucc_env" ]; then  # the bundle's UCC, unpacked or built here
      # shellcheck disable=SC1090
      source "$ucc_env"
      chmod +x "$UCC_HOME"/ucx/libucx/bin/* "$UCC_HOME"/bin/* 2>/dev/null  # a wheel's zip keeps no file modes
    fi
    paths="staged ucc ucc-triggered"
    if [ "$gpus" -lt 2 ]; then
      # Two ranks share one GPU here: NCCL refuses that ("Duplicate GPU"), and UCC falls back to tl/ucp after a
      # failed NCCL set-up. Every part runs without tl/nccl but the two that show it (diag-nccl-*, the nccl trace).
      export UCC_CL_BASIC_TLS=^nccl
    fi
  fi
  [ "$install" = 0 ] || python_step "$(budget_cut 300)" -m pip install -q --no-deps --no-build-isolation -e . \
    >>"$work/install.log" 2>&1 \
    || { cp "$work/install.log" "$out/"; cat "$work/install.log"; exit 1; }
  if [ "$(probe -c 'from hpccomm.transports.mpi_cuda import cuda_aware; print(cuda_aware())')" = True ]; then
    paths="$paths mpi"
  fi
  paths=${ACCEPTANCE_PATHS:-$paths}
  export HPCCOMM_GPU_PATHS="$paths"
  mps_control=$(command -v nvidia-cuda-mps-control || true)
  report=$out/report.md
  {
    echo "# GPU acceptance $(date -u +%FT%TZ): paths $paths; UCC $ucc_from; set up in $((SECONDS - started)) s"
    echo '```'
    timeout 60 nvidia-smi --query-gpu=name,driver_version,memory.total,compute_mode --format=csv
    # The device tool copies a working tree without its history: prepare noted the commit in the bundle.
    echo "git: $(cat "$bundle/source.txt" 2>/dev/null || echo "unknown (the bundle has no source.txt)")"
    # The probes' stderr goes to set-up.txt (shown below): a hung one's stacks reach targets.md too.
    probe -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count())'
    probe -m hpccomm info | grep -E "UCC|CUDA|TRANSPORT|library"
    probe -c 'import hpccomm.ucc.binding as b; print("UCC:", b.status()); print("UCC on CUDA memory:", b.cuda_support() or "yes")'
    probe -c 'from hpccomm.transports.mpi_cuda import cuda_aware; print("CUDA-aware MPI:", cuda_aware())'
    echo "CUDA MPS: ${mps_control:-none on this machine (nvidia-cuda-mps-control not found)}"
    echo "The UCC environment of every part (but the two that let tl/nccl in, which say so):"
    env | grep -E '^(UCC|UCX|NCCL)_' | sort
    echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
    if [ -n "${UCC_HOME:-}" ]; then
      cat "$UCC_HOME/PREBUILT" 2>/dev/null
      echo "UCC components: $(ls "$UCC_HOME/lib/ucc" | grep '\.so$' | tr '\n' ' ')"
      echo "UCX transports and memory domains (ucx_info -d):"
      timeout 20 "$UCC_HOME"/ucx/libucx/bin/ucx_info -d 2>&1 | grep -E "Transport:|Memory domain:" | sort | uniq -c
    fi
    echo '```'
    if [ -s "$setup_log" ]; then  # the first 80 lines; all of it in raw.tar.gz
      echo; echo "## The set-up's Python steps and their stderr (set-up.txt: a step past its limit prints its stacks)"
      echo '```'; head -n 80 "$setup_log"; echo '```'
    fi
  } >"$report" 2>&1
  status=0
  # In order of worth, each bounded by what is left of the budget: UCC's own numbers and the paths against each
  # other and Gloo (neither can hang for long: each job has its limit), the first test pass, the H100's failures
  # diagnosed alone and MPS (short), the second test pass (before them where the first passed: the target is two
  # passes, and the diagnoses matter most where a pass failed), then the staging floor and the team-layer traces.
  if [ -x "${UCC_HOME:-/none}/bin/ucc_perftest" ]; then
    # Out of place also with UCX's memory-type cache off, as hpccomm runs UCC on CUDA memory (binding.py's
    # turn_off_memtype_cache): the anchor with UCX set as hpccomm's is.
    for mode in oop inplace oop-nocache; do
      flag=(); [ $mode = inplace ] && flag=(-i)
      cache=(); [ $mode = oop-nocache ] && cache=(-x UCX_MEMTYPE_CACHE=n)
      part 30 "$work/perftest-$mode.txt" mpirun -n 2 -x LD_LIBRARY_PATH -x UCC_CL_BASIC_TLS "${cache[@]}" \
        "$UCC_HOME/bin/ucc_perftest" -c allreduce -m cuda -b 4 -e 67108864 -n 20 -w 5 "${flag[@]}"
    done
  fi
  # The benchmark's paths, each once: with UCC, auto beside the two it chooses between; no CUDA-aware MPI.
  bench=()
  [[ " $paths " == *" ucc "* ]] && bench=(staged ucc auto)
  for path in $paths; do [[ $path == mpi || " ${bench[*]} " == *" $path "* ]] || bench+=("$path"); done
  bench_paths=$(IFS=,; echo "${bench[*]}")
  part 150 "$work/compare.log" python3 benchmarks/cuda_allreduce.py --compare -n 2 --rounds 3 --paths "$bench_paths" \
    --job-timeout 45 --budget-s 140 --json "$work/compare.json"
  # Where a UCC all-reduce's time goes, timed perftest's way and back to back (the gap to ucc_perftest).
  ucc_stages=(env HPCCOMM_TRANSPORT=cuda:ucc HPCCOMM_CUDA_STAGED_MAX_BYTES=0 hpccomm-run -n 2 python3
              benchmarks/cuda_call_stages.py)
  [[ " $paths " == *" ucc "* ]] && part 45 "$work/stages.txt" "${ucc_stages[@]}" --json "$work/stages.json"
  part 200 "$work/pytest-1.txt" env RANK_JOB_LOGS="$work/ranks-1" python3 -m pytest -v -p no:cacheprovider \
    tests/gpu
  first_pass=$?
  [ "$first_pass" = 0 ] || status=1
  second_pass() {
    part 200 "$work/pytest-2.txt" env RANK_JOB_LOGS="$work/ranks-2" python3 -m pytest -v -p no:cacheprovider \
      tests/gpu || status=1
  }
  # Where the first pass passed, the second (the target's) comes next; where it did not, the diagnoses first.
  [ "$first_pass" != 0 ] || second_pass
  if [[ " $paths " == *" ucc "* ]]; then
    # The H100's three UCC failures, each alone with its stages timed: the compute stream (default stream and
    # a stream of the caller's), and a rank alone in a collective with tl/nccl let into the team.
    part 40 "$work/diag-stream.txt" env HPCCOMM_TRANSPORT=cuda:ucc HPCCOMM_CUDA_STAGED_MAX_BYTES=0 \
      RANKCHECK_LIMIT_S=30 hpccomm-run -n 2 python3 tests/gpu/ranks/cuda_ops.py compute_stream
    part 40 "$work/diag-nccl-alone.txt" env -u UCC_CL_BASIC_TLS UCC_COLL_TRACE=info HPCCOMM_TRANSPORT=cuda:ucc \
      HPCCOMM_CUDA_STAGED_MAX_BYTES=0 RANKCHECK_LIMIT_S=30 hpccomm-run -n 2 python3 tests/gpu/ranks/cuda_ops.py \
      missing_peer
  fi
  if [ "$ucc_from" != none ]; then
    # The triggered path's first all-reduces, alone, with UCC's execution engine traced: as hpccomm runs it (the
    # executor one cooperative kernel); with UCC's default launch (three kernels, the last loaded behind the
    # spinning one: the H100's hang, if lazy loading is its cause); and that with every kernel loaded at start
    # (torch's CUDA libraries loaded whole: a slower start, hence the longer limit).
    triggered=(env HPCCOMM_TRANSPORT=cuda:ucc HPCCOMM_CUDA_STAGED_MAX_BYTES=0 HPCCOMM_UCC_TRIGGERED=1
               RANKCHECK_LIMIT_S=12 UCC_COLL_TRACE=debug UCC_EC_CUDA_LOG_LEVEL=debug)
    part 25 "$work/diag-triggered.txt" "${triggered[@]}" hpccomm-run -n 2 python3 tests/gpu/ranks/cuda_ops.py \
      sizes_from_empty
    part 25 "$work/diag-triggered-noncoop.txt" "${triggered[@]}" UCC_EC_CUDA_USE_COOPERATIVE_LAUNCH=n \
      hpccomm-run -n 2 python3 tests/gpu/ranks/cuda_ops.py sizes_from_empty
    part 60 "$work/diag-triggered-noncoop-eager.txt" "${triggered[@]}" UCC_EC_CUDA_USE_COOPERATIVE_LAUNCH=n \
      CUDA_MODULE_LOADING=EAGER RANKCHECK_LIMIT_S=25 hpccomm-run -n 2 python3 tests/gpu/ranks/cuda_ops.py \
      sizes_from_empty
  fi
  [ "${ACCEPTANCE_MPS:-1}" != 0 ] || mps_control=""
  if [ -n "$mps_control" ] && [ -x "${UCC_HOME:-/none}/bin/ucc_perftest" ]; then
    # The same perftest and paths with MPS on (the two ranks' contexts share the GPU instead of taking turns).
    export CUDA_MPS_PIPE_DIRECTORY=/tmp/hpccomm-mps/pipe CUDA_MPS_LOG_DIRECTORY=/tmp/hpccomm-mps/log
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
    if timeout 20 "$mps_control" -d >"$work/mps-start.txt" 2>&1; then
      part 30 "$work/mps-perftest-oop.txt" mpirun -n 2 -x LD_LIBRARY_PATH -x UCC_CL_BASIC_TLS \
        -x CUDA_MPS_PIPE_DIRECTORY -x CUDA_MPS_LOG_DIRECTORY \
        "$UCC_HOME/bin/ucc_perftest" -c allreduce -m cuda -b 4 -e 67108864 -n 20 -w 5
      part 45 "$work/mps-compare.log" python3 benchmarks/cuda_allreduce.py --compare -n 2 --rounds 2 --ops all_reduce \
        --paths staged,ucc --job-timeout 20 --budget-s 40 --json "$work/mps-compare.json"
      [[ " $paths " == *" ucc "* ]] \
        && part 40 "$work/mps-stages.txt" "${ucc_stages[@]}" --json "$work/mps-stages.json"
      part 25 "$work/diag-triggered-mps.txt" "${triggered[@]}" hpccomm-run -n 2 python3 tests/gpu/ranks/cuda_ops.py \
        sizes_from_empty
      echo quit | timeout 20 "$mps_control" >>"$work/mps-start.txt" 2>&1
    else
      echo "acceptance: MPS did not start" >>"$work/mps-start.txt"
    fi
    unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
  fi
  [ "$first_pass" = 0 ] || second_pass
  part 30 "$work/floor-1.md" hpccomm-run -n 1 python3 benchmarks/cuda_staging_floor.py --json "$work/floor-1.json" \
    --profile 2000
  # Which UCC team layer serves each collective on CUDA memory.
  trace=(env UCC_COLL_TRACE=info HPCCOMM_TRANSPORT=cuda:ucc HPCCOMM_CUDA_STAGED_MAX_BYTES=0 hpccomm-run -n 2
         python3 benchmarks/cuda_allreduce.py --sizes 4,4194304 --rounds 1 --iters 2)
  if [[ " $paths " == *" ucc "* ]]; then
    part 30 "$work/ucc-trace.txt" "${trace[@]}"
    part 30 "$work/ucc-trace-nccl.txt" env -u UCC_CL_BASIC_TLS "${trace[@]}"
  fi
  part 30 "$work/floor-2.md" hpccomm-run -n 2 python3 benchmarks/cuda_staging_floor.py
  checkpoint  # targets.md: tests/gpu/targets.py reads the pytest and diag-* logs' HUNG and FAIL lines
  why() {  # a part without results: the error its log names (tests/ended.py), not the launcher's last words
    [ -f "$1" ] || { echo "no log: it did not run"; return 0; }
    python3 -c 'import sys; sys.path.insert(0, "tests"); from ended import error_that_ended as e
print(e(open(sys.argv[1], errors="replace").read()) or "no error named")' "$1"
    grep -a "acceptance:" "$1" | tail -n 2
  }
  # grep -a throughout: Open MPI 5's prterun ends its abort notice with a NUL byte, which makes grep call a log binary.
  {
    echo; echo "## Targets"; cat "$out/targets.md"
    for mode in oop inplace oop-nocache; do
      echo; echo "## ucc_perftest allreduce on CUDA memory, $mode (count, bytes, avg/min/max us)"; echo '```'
      grep -aE "^ +[0-9]+ +[0-9]+ " "$work/perftest-$mode.txt" || why "$work/perftest-$mode.txt"
      echo '```'
    done
    echo; echo "## Every path (benchmarks/cuda_allreduce.py --compare)"; cat "$work/compare.log"
    for stages in stages mps-stages; do
      [ -f "$work/$stages.txt" ] || continue
      echo; echo "## Where a UCC all-reduce's time goes, us ($stages.txt: benchmarks/cuda_call_stages.py)"
      grep -aE "^\|" "$work/$stages.txt" || why "$work/$stages.txt"
    done
    if [ -f "$work/mps-start.txt" ]; then
      echo; echo "## With MPS on"; echo '```'; cat "$work/mps-start.txt"
      grep -aE "^ +[0-9]+ +[0-9]+ " "$work/mps-perftest-oop.txt" || why "$work/mps-perftest-oop.txt"
      echo '```'; cat "$work/mps-compare.log" 2>/dev/null
    fi
    shown="^(OK|FAIL|FAILED|HUNG) |Timed out|uncaught|acceptance:|CL_BASIC|TL_[A-Z]+|Duplicate GPU|executor|triggered_post"
    frames="^#[0-9]+ .* in (cu[A-Z]|cuda[A-Z]|ucc_|uct_|ucp_)"  # CUDA's and UCC's frames in the native stacks
    for diag in "$work"/diag-*.txt; do
      [ -f "$diag" ] || continue
      echo; echo "## $(basename "$diag")"; echo '```'
      grep -aE "$shown|$frames" "$diag" \
        | sed -E "s/^\[[0-9.]+\] \[[^]]*\] *//; s/^#[0-9]+ +0x[0-9a-f]+ in /in /" | sort | uniq -c | sort -rn | head -40
      echo '```'
    done
    for n in 1 2; do echo; echo "## Staging floor, $n rank(s)"; cat "$work/floor-$n.md"; done
    for trace in ucc-trace ucc-trace-nccl; do
      [ -f "$work/$trace.txt" ] || continue
      echo; echo "## Team layers ($trace: UCC_COLL_TRACE)"; echo '```'
      grep -aohE "(CL|TL)_[A-Z]+[^;,]*|Duplicate GPU|NOT_SUPPORTED|acceptance: exit status [0-9]+" "$work/$trace.txt" \
        | sort | uniq -c
      echo '```'
    done
    echo; echo "## tests/gpu"; echo '```'; tail -n 3 "$work"/pytest-*.txt; echo '```'
    echo; echo "total $((SECONDS - started)) s of a $budget s budget"
  } >>"$report" 2>&1
  tar -czf "$out/raw.tar.gz" -C "$work" .
  rm -rf "$work"
  cat "$report"
  exit $status
  ;;
*)
  echo "usage: bash tests/gpu/acceptance.sh prepare|run [bundle dir] [UCC source]" >&2
  exit 2
  ;;
esac
