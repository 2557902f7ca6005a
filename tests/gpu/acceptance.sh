#!/usr/bin/env bash
# The GPU acceptance command, in two halves.
#
#   bash tests/gpu/acceptance.sh prepare [DIR] [UCC_SOURCE]   here (with PyPI): what the GPU machine cannot
#                                                              download, into DIR (default .gpu-bundle, git-ignored)
#   bash tests/gpu/acceptance.sh run [DIR]                     on the GPU machine, through the device tool:
#       run(command="bash tests/gpu/acceptance.sh run", carry=[".gpu-bundle"], timeout_s=540)
#
# UCC_SOURCE: an autogen'd UCC source tarball (one top directory, as ../shared/ucc/ucc-1.8.0-autogen.tar.gz),
# bundled as it is; or a UCC source checkout (a git clone of openucx/ucc, e.g. of the mirror `fetch
# github:openucx/ucc` brings: git clone /work/.mirror/openucx+ucc/repo /tmp/ucc), whose autogen.sh 'prepare'
# runs here (the GPU machine has no libtoolize) before bundling the generated tree. Not given: the tarball
# .ci/run builds UCC from ($HPCCOMM_UCC_SOURCE, else ../shared/ucc/ucc-1.8.0-autogen.tar.gz beside this
# checkout, else /work/shared/ucc/...), where found. With UCC the bundle holds a libucx-cu13 wheel too (UCX with
# CUDA); without, 'run' tests the staged path alone. Bundle: about 50 MB with UCC (carry limit 64).
#
# The GPU machine (../shared/FACTS.md) has a Python 3.12 venv with torch (CUDA) and mpi4py on the system
# Open MPI, and no network. 'run' builds UCC there with CUDA, tl/nccl (on the NCCL wheel torch brought) and
# ucc_perftest (on the system Open MPI) (tests/build_ucc.sh --cuda --nccl, about 2 minutes), installs hpccomm
# against it from this checkout (no dependencies fetched), then, in order of worth, each part bounded by what
# is left of ACCEPTANCE_BUDGET_S (default 450 s, build included, so that the call stays under 8 minutes and a
# rerun fits in a session's device time): tests/gpu on every path (staged, ucc, ucc-triggered, mpi where the
# MPI is CUDA-aware); benchmarks/cuda_allreduce.py --compare (every path, UCC's in-place modes, auto and Gloo,
# 4 B to 64 MiB, and the staged limit to set); ucc_perftest all-reduce on CUDA memory out of place and in
# place; the staging floor at one rank, with a cProfile of the staged call; UCC_COLL_TRACE (the team layer
# per collective); tests/gpu again; the trace with tl/nccl allowed; UCX's memtype cache left on; the staging
# floor at two ranks; benchmarks/staged_host_cost.py (hpccomm's own host work per staged call on that CPU).
# Into $OUT (default ./gpu-out), five files: targets.md (tests/gpu/targets.py: PASS, SHORT or "not measured"
# per target, every ratio from this run), report.md (the machine, UCC's components, UCX's transports, every
# table above), pytest-1.txt and pytest-2.txt, raw.tar.gz (every log and JSON). A part the budget leaves no
# time for says so in its log. Exit status: that of the test passes.
set -euo pipefail
cd "$(dirname "$0")/../.."
mode=${1:-}
bundle=${2:-.gpu-bundle}

case "$mode" in
prepare)
  mkdir -p "$bundle/wheels"
  # cffi builds hpccomm's C extensions; pytest runs tests/gpu. For the GPU machine's CPython 3.12.
  python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$bundle/wheels" cffi pytest
  ls "$bundle/wheels"/cffi-*-cp312-*.whl "$bundle/wheels"/pytest-*.whl >/dev/null
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
  echo "prepared $bundle: $(cd "$bundle" && find . -type f | sort | tr '\n' ' ')"
  du -sh "$bundle"
  ;;
run)
  set +e  # every part runs and reports; the exit status is the test passes'
  out=${OUT:-$PWD/gpu-out}
  work=$(mktemp -d)  # everything raw; $OUT gets the five files the header names
  mkdir -p "$out"
  started=$SECONDS
  budget=${ACCEPTANCE_BUDGET_S:-450}
  within() {  # seconds file command...: run it into file under timeout, at most what is left of the budget
    local limit=$1 file=$2 left=$((budget - (SECONDS - started))); shift 2
    if [ "$left" -lt 15 ]; then echo "acceptance: out of time (budget ${budget} s), skipped: $*" >"$file"; return 124; fi
    [ "$limit" -le "$left" ] || limit=$left
    timeout "$limit" "$@" >"$file" 2>&1
    local rc=$?
    echo "acceptance: exit status $rc after $((SECONDS - started)) s" >>"$file"
    return $rc
  }
  python3 -m pip install -q --no-index --find-links "$bundle/wheels" cffi pytest >"$work/install.log" 2>&1 \
    || { cat "$work/install.log"; exit 1; }
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  gpus=$(python3 -c 'import torch; print(torch.cuda.device_count())')
  paths="staged"
  if [ -f "$bundle/ucc-source.tar.gz" ]; then
    if bash tests/build_ucc.sh --cuda --nccl "$bundle/ucc-source.tar.gz" "$bundle"/ucx/libucx_cu13-*.whl /tmp/hpccomm-ucc \
        >"$work/ucc-env.sh" 2>"$work/ucc-build.txt"; then
      # shellcheck disable=SC1091
      source "$work/ucc-env.sh"
      paths="staged ucc ucc-triggered"
      chmod +x "$UCC_HOME"/ucx/libucx/bin/*  # a wheel's zip keeps no file modes
      if [ "$gpus" -lt 2 ]; then
        # Two ranks share one GPU here: NCCL refuses that ("Duplicate GPU"); UCC then falls back to tl/ucp
        # after a slow first call (and hung once in three). Left out but for the one trace run that shows it.
        export UCC_CL_BASIC_TLS=^nccl
      fi
    else
      echo "UCC build failed: testing the staged path alone (raw.tar.gz: ucc-build.txt)"
    fi
  fi
  python3 -m pip install -q --no-deps --no-build-isolation -e . >>"$work/install.log" 2>&1 \
    || { cat "$work/install.log"; exit 1; }
  if [ "$(python3 -c 'from hpccomm.transports.mpi_cuda import cuda_aware; print(cuda_aware())')" = True ]; then
    paths="$paths mpi"
  fi
  report=$out/report.md
  {
    echo "# GPU acceptance $(date -u +%FT%TZ): paths $paths; UCC built and hpccomm installed in $SECONDS s"
    echo '```'
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
    python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count())'
    python3 -m hpccomm info 2>&1 | grep -E "UCC|CUDA|TRANSPORT|library"
    python3 -c 'import hpccomm.ucc.binding as b; print("UCC:", b.status()); print("UCC on CUDA memory:", b.cuda_support() or "yes")'
    python3 -c 'from hpccomm.transports.mpi_cuda import cuda_aware; print("CUDA-aware MPI:", cuda_aware())'
    echo "UCC_CL_BASIC_TLS=${UCC_CL_BASIC_TLS:-(unset)}"
    if [ -n "${UCC_HOME:-}" ]; then
      echo "UCC components: $(ls "$UCC_HOME/lib/ucc" | tr '\n' ' ')"
      echo "UCX transports and memory domains (ucx_info -d):"
      "$UCC_HOME"/ucx/libucx/bin/ucx_info -d 2>&1 | grep -E "Transport:|Memory domain:" | sort | uniq -c
    fi
    echo '```'
  } >"$report" 2>&1
  # In order of worth, each bounded by what is left of the budget: the first test pass, the paths against
  # each other and Gloo, UCC's own numbers, the staging floor, the second test pass, then the team layers.
  status=0
  HPCCOMM_GPU_PATHS="$paths" within 200 "$out/pytest-1.txt" python3 -m pytest -v -p no:cacheprovider tests/gpu || status=1
  bench_paths=staged
  [[ " $paths " == *" ucc "* ]] && bench_paths="staged,ucc,ucc-native,ucc-tuned,ucc-triggered,auto"
  within 150 "$work/compare.log" python3 benchmarks/cuda_allreduce.py --compare -n 2 --rounds 3 --paths "$bench_paths" \
    --job-timeout 45 --json "$work/compare.json"
  if [ -x "${UCC_HOME:-/none}/bin/ucc_perftest" ]; then
    for mode in oop inplace; do
      flag=(); [ $mode = inplace ] && flag=(-i)
      within 40 "$work/perftest-$mode.txt" mpirun -n 2 -x LD_LIBRARY_PATH -x UCC_CL_BASIC_TLS \
        "$UCC_HOME/bin/ucc_perftest" -c allreduce -m cuda -b 1 -e 16777216 -n 20 -w 5 "${flag[@]}"
    done
  fi
  within 40 "$work/floor-1.md" hpccomm-run -n 1 python3 benchmarks/cuda_staging_floor.py --json "$work/floor-1.json" \
    --profile 2000
  # Which UCC team layer serves each collective on CUDA memory.
  trace=(env UCC_COLL_TRACE=info HPCCOMM_TRANSPORT=cuda:ucc HPCCOMM_CUDA_STAGED_MAX_BYTES=0 hpccomm-run -n 2
         python3 benchmarks/cuda_allreduce.py --sizes 4,4194304 --rounds 1 --iters 2)
  [[ " $paths " == *" ucc "* ]] && within 40 "$work/ucc-trace.txt" "${trace[@]}"
  HPCCOMM_GPU_PATHS="$paths" within 200 "$out/pytest-2.txt" python3 -m pytest -v -p no:cacheprovider tests/gpu || status=1
  if [[ " $paths " == *" ucc "* ]]; then
    # With tl/nccl allowed (two ranks on one GPU: NCCL refuses, UCC falls back); then UCX's memtype cache
    # left on (UCX 1.22's default), to see whether the crash it is turned off for comes back.
    within 40 "$work/ucc-trace-nccl.txt" env -u UCC_CL_BASIC_TLS "${trace[@]}"
    within 40 "$work/memtype-on.txt" env UCX_MEMTYPE_CACHE=try HPCCOMM_TRANSPORT=cuda:ucc \
      HPCCOMM_CUDA_STAGED_MAX_BYTES=0 hpccomm-run -n 2 python3 benchmarks/cuda_allreduce.py \
      --sizes 4,65536,4194304,67108864 --rounds 2
  fi
  within 40 "$work/floor-2.md" hpccomm-run -n 2 python3 benchmarks/cuda_staging_floor.py
  # hpccomm's own host work per staged call on this host's CPU, no device involved (the floor's complement).
  within 40 "$work/staged-host-cost.md" hpccomm-run -n 1 python3 benchmarks/staged_host_cost.py
  python3 tests/gpu/targets.py "$work" >"$out/targets.md"
  {
    echo; echo "## Targets"; cat "$out/targets.md"
    echo; echo "## Every path (benchmarks/cuda_allreduce.py --compare)"; cat "$work/compare.log"
    for mode in oop inplace; do
      echo; echo "## ucc_perftest allreduce on CUDA memory, $mode (count, bytes, avg/min/max us)"; echo '```'
      grep -E "^ +[0-9]+ +[0-9]+ " "$work/perftest-$mode.txt" || tail -n 5 "$work/perftest-$mode.txt"
      echo '```'
    done
    for n in 1 2; do echo; echo "## Staging floor, $n rank(s)"; cat "$work/floor-$n.md"; done
    [ -f "$work/staged-host-cost.md" ] && { echo; echo "## hpccomm's own host work per staged call"; cat "$work/staged-host-cost.md"; }
    for trace in ucc-trace ucc-trace-nccl; do
      [ -f "$work/$trace.txt" ] || continue
      echo; echo "## Team layers ($trace: UCC_COLL_TRACE)"; echo '```'
      grep -ohE "(CL|TL)_[A-Z]+[^;,]*|Duplicate GPU|NOT_SUPPORTED|acceptance: exit status [0-9]+" "$work/$trace.txt" \
        | sort | uniq -c
      echo '```'
    done
    if [ -f "$work/memtype-on.txt" ]; then
      echo; echo "## UCX memtype cache left on"; echo '```'; tail -n 12 "$work/memtype-on.txt"; echo '```'
    fi
    echo; echo "## tests/gpu"; echo '```'; tail -n 3 "$out"/pytest-*.txt; echo '```'
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
