#!/usr/bin/env bash
# The GPU acceptance command, in two halves.
#
#   bash tests/gpu/acceptance.sh prepare [DIR]   here (with PyPI): what the GPU machine cannot download,
#                                                into DIR (default .gpu-bundle, git-ignored)
#   bash tests/gpu/acceptance.sh run [DIR]       on the GPU machine, through the device tool:
#       run(command="bash tests/gpu/acceptance.sh run", carry=[".gpu-bundle"], timeout_s=600)
#
# The GPU machine (../shared/FACTS.md) has a Python 3.12 venv with torch (CUDA) and mpi4py on the
# system Open MPI, and no network. 'run' installs hpccomm there from this checkout (no dependencies
# fetched), then writes into $OUT (default ./gpu-out): environment.txt (GPU, torch, MPI, hpccomm's
# paths and the transport it picks for CUDA), pytest-1.txt and pytest-2.txt (tests/gpu twice: the
# issue asks for two passes in a row), bench.md (benchmarks/cuda_allreduce.py: hpccomm against Gloo
# on CUDA tensors, 4 B to 64 MiB), floor.md (benchmarks/cuda_staging_floor.py at 1 and 2 ranks: what
# staging costs per call on this GPU, and each torch.cuda call's host time). Exit status: that of the
# test passes. About 2 minutes on an H100 and an H200 (2026-11-26), besides the machine's start.
#
# CUDA tensors go through host memory today; when UCC's CUDA path exists, 'prepare' also bundles
# the UCC source and a libucx-cu13 wheel and 'run' builds UCC with CUDA against it first.
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
  echo "prepared $bundle: $(ls "$bundle/wheels" | tr '\n' ' ')"
  ;;
run)
  out=${OUT:-$PWD/gpu-out}
  mkdir -p "$out"
  python3 -m pip install -q --no-index --find-links "$bundle/wheels" cffi pytest >"$out/install.log" 2>&1
  python3 -m pip install -q --no-deps --no-build-isolation -e . >>"$out/install.log" 2>&1
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  {
    nvidia-smi || true
    python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count())'
    python3 -m hpccomm info
    python3 -c 'import logging, hpccomm; from hpccomm.transports import selection
logging.basicConfig(level=logging.INFO); print(selection.routes())'
  } >"$out/environment.txt" 2>&1
  status=0
  for pass in 1 2; do
    python3 -m pytest -v -p no:cacheprovider tests/gpu >"$out/pytest-$pass.txt" 2>&1 || status=1
  done
  hpccomm-run -n 2 python3 benchmarks/cuda_allreduce.py >"$out/bench.md" 2>&1 || true
  for n in 1 2; do hpccomm-run -n $n python3 benchmarks/cuda_staging_floor.py >>"$out/floor.md" 2>&1 || true; done
  tail -n 3 "$out"/pytest-*.txt
  cat "$out/bench.md" "$out/floor.md"
  exit $status
  ;;
*)
  echo "usage: bash tests/gpu/acceptance.sh prepare|run [bundle dir]" >&2
  exit 2
  ;;
esac
