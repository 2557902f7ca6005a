#!/usr/bin/env bash
# UCC for the GPU machine, built here: tests/gpu/acceptance.sh 'run' unpacks it instead of building UCC
# there (130-150 s of scarce device time a call, against a few seconds to unpack).
#
#   bash tests/gpu/prebuild_ucc.sh [BUNDLE] [UCC_SOURCE]
#
# BUNDLE: the folder carried to the GPU machine (default .gpu-bundle); gets ucc-prebuilt.tar.gz, and the
#   libucx-cu13 1.22.0 wheel in BUNDLE/ucx where 'prepare' has not put it yet. UCC_SOURCE: an autogen'd UCC
#   source tarball (default BUNDLE/ucc-source.tar.gz, else ../shared/ucc/ucc-1.8.0-autogen.tar.gz or
#   /work/shared/ucc/...).
#
# tests/build_ucc.sh --cuda --nccl into /tmp/hpccomm-ucc, the path the GPU machine unpacks into (UCC's rpaths
# and ucc.pc name it), for the GPU machine's CUDA 13.0 and sm_90 (H100, H200; NVCC_GENCODE to change):
# CUDA from CUDA_HOME (default /usr/local/cuda), nvml.h from the nvidia-nvml-dev 13.0 wheel (tl/cuda needs
# it), NCCL's headers from the nvidia-nccl-cu13 2.28.9 wheel torch 2.11 pins (build_ucc.sh's NCCL_HOME; no
# libcuda here: build_ucc.sh links against stand-ins, and the GPU machine's driver loads), ucc_perftest on
# the Debian Open MPI 4.1 here (apt-installed where mpicc is missing; libmpi.so.40, as the GPU machine's
# Open MPI 4.1.6; /usr/bin's where a venv's MPI wheel comes first on PATH). Debug info stripped (bin and lib
# 21 MB to 9 MB).
#
# The tarball holds the installed tree without ucx/ (the wheel, which 'run' unzips there, is carried anyway)
# and with ucc-env.sh (build_ucc.sh's two export lines: UCX, UCC, then the NCCL wheel of the GPU machine's
# python3, found when sourced, then /usr/local/cuda/lib64) and PREBUILT (what it was built with, how long).
# About 2 minutes on 2 cores (115-148 s, downloads included: the NCCL wheel, 196 MB, and nvml.h's, deleted
# after); the tarball is 2.1 MB. Needs PyPI; nothing is left but the bundle and /tmp/hpccomm-ucc (155 MB,
# the unzipped UCX included).
set -euo pipefail
cd "$(dirname "$0")/../.."
bundle=${1:-.gpu-bundle}
src=${2:-}
for candidate in "$bundle/ucc-source.tar.gz" ../shared/ucc/ucc-1.8.0-autogen.tar.gz \
                 /work/shared/ucc/ucc-1.8.0-autogen.tar.gz; do
  if [ -z "$src" ] && [ -f "$candidate" ]; then src=$candidate; fi
done
[ -n "$src" ] || { echo "prebuild_ucc.sh: no UCC source: give an autogen'd UCC source tarball" >&2; exit 2; }
prefix=/tmp/hpccomm-ucc
pip_get() {  # dir platform requirement: one wheel for the GPU machine's CPython 3.12
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --platform "$2" -d "$1" "$3"
}

started=$SECONDS
mkdir -p "$bundle/ucx"
rm -f "$bundle/ucc-prebuilt.tar.gz"
if ! command -v mpicc >/dev/null; then
  echo "prebuild_ucc.sh: no mpicc: apt-get install openmpi-bin libopenmpi-dev" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q openmpi-bin libopenmpi-dev >/dev/null
fi
open_mpi_4() { "$1" --version 2>/dev/null | grep -q 'Open MPI) 4\.'; }
if ! open_mpi_4 mpirun && open_mpi_4 /usr/bin/mpirun; then  # an active venv's MPI wheel first on PATH
  echo "prebuild_ucc.sh: $(command -v mpirun) is not Open MPI 4; ucc_perftest gets /usr/bin's" >&2
  export PATH=/usr/bin:$PATH
fi
open_mpi_4 mpirun \
  || { echo "prebuild_ucc.sh: $(command -v mpicc) is not Open MPI 4 (the GPU machine's MPI)" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
ls "$bundle"/ucx/libucx_cu13-1.22.0-*.whl >/dev/null 2>&1 || pip_get "$bundle/ucx" manylinux_2_28_x86_64 libucx-cu13==1.22.0
pip_get "$work" manylinux_2_18_x86_64 nvidia-nccl-cu13==2.28.9
pip_get "$work" manylinux_2_17_x86_64 nvidia-nvml-dev==13.0.87
python3 -m zipfile -e "$work"/nvidia_nvml_dev-*.whl "$work/nvml"

export NVCC_GENCODE=${NVCC_GENCODE:--gencode=arch=compute_90,code=sm_90}
# OMPI_SKIP_MPICXX and --as-needed: ucc_perftest needs libmpi.so.40 alone, not Open MPI's C++ bindings.
CPPFLAGS="-I$work/nvml/nvidia/cu13/include -DOMPI_SKIP_MPICXX=1" LDFLAGS="-Wl,--as-needed" \
  NCCL_HOME=$(echo "$work"/nvidia_nccl_cu13-*.whl) \
  bash tests/build_ucc.sh --cuda --nccl "$src" "$bundle"/ucx/libucx_cu13-1.22.0-*.whl "$prefix" >"$work/ucc-env.sh"
mv "$work/ucc-env.sh" "$prefix/ucc-env.sh"
for component in libucc_tl_cuda.so libucc_tl_nccl.so; do
  [ -e "$prefix/lib/ucc/$component" ] || { echo "prebuild_ucc.sh: built without $component" >&2; exit 1; }
done
[ -x "$prefix/bin/ucc_perftest" ] || { echo "prebuild_ucc.sh: built without ucc_perftest" >&2; exit 1; }
unstripped=$(du -sk "$prefix/bin" "$prefix/lib" | awk '{ k += $1 } END { print k }')
find "$prefix/bin" "$prefix/lib" -type f \( -name '*.so*' -o -perm -u+x \) -exec strip --strip-debug {} +
{
  echo "UCC $(basename "$src") built by tests/gpu/prebuild_ucc.sh on $(hostname) at $(date -u +%FT%TZ) in $((SECONDS - started)) s"
  echo "CUDA: $("${CUDA_HOME:-/usr/local/cuda}"/bin/nvcc --version | grep -o 'release [^,]*, V[0-9.]*')," \
       "$NVCC_GENCODE; NCCL headers 2.28.9 (nvidia-nccl-cu13); nvml.h 13.0.87 (nvidia-nvml-dev)"
  echo "UCX: $(basename "$bundle"/ucx/libucx_cu13-1.22.0-*.whl) (not in the tarball: unzip it into $prefix/ucx)"
  echo "ucc_perftest: $(mpirun --version | head -n 1)"
  echo "compiler: $(cc --version | head -n 1); bin and lib $unstripped KiB, $(du -sk "$prefix/bin" "$prefix/lib" \
    | awk '{ k += $1 } END { print k }') KiB with debug info stripped"
} >"$prefix/PREBUILT"
tar -czf "$work/ucc-prebuilt.tar.gz" -C "$prefix" --exclude=./ucx .
mv "$work/ucc-prebuilt.tar.gz" "$bundle/ucc-prebuilt.tar.gz"
cat "$prefix/PREBUILT"
echo "prebuild_ucc.sh: $bundle/ucc-prebuilt.tar.gz, $(du -k "$bundle/ucc-prebuilt.tar.gz" | cut -f1) KiB; $bundle: $(du -sk "$bundle" | cut -f1) KiB"
