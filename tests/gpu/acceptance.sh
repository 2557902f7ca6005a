#!/usr/bin/env bash
# The GPU acceptance command, in two halves.
#
#   bash tests/gpu/acceptance.sh prepare [DIR] [UCC_SOURCE]   here (with PyPI): what the GPU machine cannot
#                                                              download, into DIR (default .gpu-bundle, git-ignored)
#   bash tests/gpu/acceptance.sh run [DIR]                     on the GPU machine, through the device tool:
#       run(command="bash tests/gpu/acceptance.sh run", carry=[".gpu-bundle"], timeout_s=600)
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
# against it from this checkout (no dependencies fetched), then writes into $OUT (default ./gpu-out):
# environment.txt (GPU, torch, MPI, UCC's CUDA support, the route hpccomm picks for CUDA), ucc-build.txt,
# pytest-1.txt and pytest-2.txt (tests/gpu twice: every check on the staged path, on UCC, and on MPI where it
# is CUDA-aware),
# bench-<path>.md (benchmarks/cuda_allreduce.py per path: staged, ucc at every size, auto: hpccomm against
# Gloo, 4 B to 64 MiB; the crossover for HPCCOMM_CUDA_STAGED_MAX_BYTES is where ucc's column beats staged's),
# perftest.txt (ucc_perftest all-reduce on CUDA memory, 16 MiB and up, for the busbw ratio), ucc-trace.txt
# (UCC_COLL_TRACE=info: the team layer serving each collective on CUDA memory), floor.md
# (benchmarks/cuda_staging_floor.py). Exit status: that of the test passes.
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
  out=${OUT:-$PWD/gpu-out}
  mkdir -p "$out"
  python3 -m pip install -q --no-index --find-links "$bundle/wheels" cffi pytest >"$out/install.log" 2>&1
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  paths="staged"
  if [ -f "$bundle/ucc-source.tar.gz" ]; then
    if bash tests/build_ucc.sh --cuda --nccl "$bundle/ucc-source.tar.gz" "$bundle"/ucx/libucx_cu13-*.whl /tmp/hpccomm-ucc \
        >"$out/ucc-env.sh" 2>"$out/ucc-build.txt"; then
      # shellcheck disable=SC1091
      source "$out/ucc-env.sh"
      paths="staged ucc"
    else
      echo "UCC build failed: testing the staged path alone (see ucc-build.txt)"
    fi
  fi
  python3 -m pip install -q --no-deps --no-build-isolation -e . >>"$out/install.log" 2>&1
  if [ "$(python3 -c 'from hpccomm.transports.mpi_cuda import cuda_aware; print(cuda_aware())')" = True ]; then
    paths="$paths mpi"
  fi
  {
    nvidia-smi || true
    python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count())'
    python3 -m hpccomm info
    python3 -c 'import hpccomm.ucc.binding as b; print("UCC:", b.status()); print("UCC on CUDA memory:", b.cuda_support() or "yes")'
    python3 -c 'from hpccomm.transports.mpi_cuda import cuda_aware; print("CUDA-aware MPI:", cuda_aware())'
    python3 -c 'import logging, hpccomm; from hpccomm.transports import selection
logging.basicConfig(level=logging.INFO); print(selection.routes())'
  } >"$out/environment.txt" 2>&1
  status=0
  for pass in 1 2; do
    HPCCOMM_GPU_PATHS="$paths" python3 -m pytest -v -p no:cacheprovider tests/gpu >"$out/pytest-$pass.txt" 2>&1 || status=1
  done
  for path in $paths auto; do
    case $path in
      staged) env=(HPCCOMM_TRANSPORT=cuda:staged) ;;
      ucc) env=(HPCCOMM_TRANSPORT=cuda:ucc HPCCOMM_CUDA_STAGED_MAX_BYTES=0) ;;
      mpi) env=(HPCCOMM_TRANSPORT=cuda:mpi HPCCOMM_CUDA_STAGED_MAX_BYTES=0) ;;
      auto) [ "$paths" = staged ] && continue; env=() ;;
    esac
    env "${env[@]}" hpccomm-run -n 2 python3 benchmarks/cuda_allreduce.py >"$out/bench-$path.md" 2>&1 || true
  done
  if [[ " $paths " == *" ucc "* ]]; then
    # Which UCC team layer serves each collective on CUDA memory.
    UCC_COLL_TRACE=info HPCCOMM_TRANSPORT=cuda:ucc HPCCOMM_CUDA_STAGED_MAX_BYTES=0 timeout 120 hpccomm-run -n 2 \
      python3 benchmarks/cuda_allreduce.py --sizes 4,1048576 --rounds 1 --iters 1 >"$out/ucc-trace.txt" 2>&1 || true
    timeout 300 mpirun -n 2 -x LD_LIBRARY_PATH -x UCX_MEMTYPE_CACHE=n "$UCC_HOME/bin/ucc_perftest" -c allreduce \
      -m cuda -b 16777216 -e 67108864 >"$out/perftest.txt" 2>&1 || true
  fi
  for n in 1 2; do hpccomm-run -n $n python3 benchmarks/cuda_staging_floor.py >>"$out/floor.md" 2>&1 || true; done
  tail -n 3 "$out"/pytest-*.txt
  cat "$out"/bench-*.md "$out/floor.md"
  [ -f "$out/perftest.txt" ] && tail -n 8 "$out/perftest.txt"
  exit $status
  ;;
*)
  echo "usage: bash tests/gpu/acceptance.sh prepare|run [bundle dir] [UCC source]" >&2
  exit 2
  ;;
esac
