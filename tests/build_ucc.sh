#!/usr/bin/env bash
# Build UCC against the UCX of a libucx-cu12/cu13 wheel. UCC is on neither PyPI nor Debian, so this is how
# hpccomm's UCC tests get one: CI builds it for host memory (.ci/run), tests/gpu/acceptance.sh with CUDA and
# NCCL on the GPU machine; usable on any machine.
#
#   bash tests/build_ucc.sh [--cuda] [--nccl] [--no-mpi] UCC_SOURCE UCX_WHEEL PREFIX
#
# UCC_SOURCE: a UCC source tree on which ./autogen.sh has run, or a .tar.gz of one (one top directory, as
#   ../shared/ucc/ucc-1.8.0-autogen.tar.gz): configure is already generated, so no autotools are needed.
# UCX_WHEEL: a libucx-cu12 or -cu13 wheel file (UCX 1.22 there; UCC 1.8 does not build against Debian 12's
#   UCX 1.13), unpacked into PREFIX/ucx.
# PREFIX: where UCC is installed; the build's logs go to PREFIX/*.log.
#
# Default: host memory only (TLs ucp and self; no CUDA, NCCL, ROCm, SHARP, verbs).
# --cuda: UCC's CUDA components, CUDA from CUDA_HOME (default /usr/local/cuda), kernels for NVCC_GENCODE
#   (default sm_90: H100, H200); the wheel must carry UCX's CUDA transports (libuct_cuda).
# --nccl (with --cuda): tl/nccl too, against the NCCL of the nvidia-nccl-cu13/-cu12 wheel installed for
#   `python3` (torch's CUDA builds pull it in). The wheel has no libnccl.so, so PREFIX/nccl holds links to its
#   headers and its libnccl.so.2 for the build.
# --no-mpi: no ucc_perftest. Otherwise ucc_perftest (UCC's own benchmark, run under mpirun) is built with the
#   MPI whose mpicc is first on PATH, where there is one.
#
# stdout: only the two lines to export for hpccomm's install and its runs, UCC_HOME and LD_LIBRARY_PATH (the
# wheel's UCX first: Debian's libucx0 and an MPI's own UCX are older, and have no CUDA; with --nccl, the NCCL
# wheel's lib directory too). Progress and errors go to stderr, an error with the tail of its log; the exit
# status is non-zero on failure.
set -euo pipefail
usage="usage: bash tests/build_ucc.sh [--cuda] [--nccl] [--no-mpi] UCC_SOURCE UCX_WHEEL PREFIX"
cuda_build=no; nccl=no; mpi=yes
while [ $# -gt 0 ]; do
  case $1 in
    --cuda) cuda_build=yes ;;
    --nccl) nccl=yes ;;
    --no-mpi) mpi=no ;;
    --*) echo "$usage" >&2; exit 2 ;;
    *) break ;;
  esac
  shift
done
[ $# -eq 3 ] || { echo "$usage" >&2; exit 2; }
fail() {  # message [log]: say what failed, with the log's tail, and stop
  echo "build_ucc.sh: $1" >&2
  if [ -n "${2:-}" ]; then tail -n 40 "$2" >&2; fi
  exit 1
}
[ $nccl = no ] || [ $cuda_build = yes ] || fail "--nccl needs --cuda"
[ -e "$1" ] || fail "no UCC source at $1"
[ -f "$2" ] || fail "no UCX wheel at $2"
src=$(realpath "$1"); wheel=$(realpath "$2")
mkdir -p "$3"; prefix=$(realpath "$3")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

if [ -f "$src" ]; then
  top=$(tar -tzf "$src" | cut -d/ -f1 | sort -u)
  [ "$(wc -l <<<"$top")" -eq 1 ] || fail "$src should hold one top directory, not: $(tr '\n' ' ' <<<"$top")"
  tar -xzf "$src" -C "$work"
  src=$work/$top
fi
[ -x "$src/configure" ] || fail "$src has no configure script: run its ./autogen.sh first"

# The wheel's UCX: unzipped; its libtool archives removed (they name the wheel's build paths) and the
# prefix in its pkg-config files pointed at where it now is.
rm -rf "$prefix/ucx" && mkdir -p "$prefix/ucx"
python3 -m zipfile -e "$wheel" "$prefix/ucx" || fail "cannot unzip $wheel (a wheel is a zip file)"
ucx=$prefix/ucx/libucx
[ -d "$ucx/lib" ] || fail "$wheel holds no libucx/lib: not a libucx-cu12/cu13 wheel"
find "$ucx" -name '*.la' -delete
for pc in "$ucx"/lib/pkgconfig/*.pc; do sed -i "s|^prefix=.*|prefix=$ucx|" "$pc"; done
library_path=$ucx/lib:$prefix/lib

options=(--prefix="$prefix" --with-ucx="$ucx" --without-rocm --without-rccl --without-sharp --without-doca_urom
         --without-ibverbs --without-rdmacm --disable-static)
if [ $cuda_build = yes ]; then
  ls "$ucx"/lib/ucx/libuct_cuda.so* >/dev/null 2>&1 || fail "$wheel has no CUDA transports (lib/ucx/libuct_cuda.so)"
  options+=(--with-cuda="${CUDA_HOME:-/usr/local/cuda}" --with-nvcc-gencode="${NVCC_GENCODE:--gencode=arch=compute_90,code=sm_90}")
else
  options+=(--without-cuda)
fi
if [ $nccl = yes ]; then
  # nvidia.nccl is a namespace package: its directory comes from __path__.
  wheel_nccl=$(python3 -c 'import os, nvidia.nccl as n
print(next(d for d in n.__path__ if os.path.exists(os.path.join(d, "lib", "libnccl.so.2"))))' 2>/dev/null || true)
  [ -n "$wheel_nccl" ] || fail "--nccl: $(command -v python3) has no nvidia-nccl-cu13/-cu12 wheel (nvidia/nccl/lib/libnccl.so.2)"
  rm -rf "$prefix/nccl" && mkdir -p "$prefix/nccl/lib"
  ln -s "$wheel_nccl/include" "$prefix/nccl/include"
  ln -s "$wheel_nccl/lib/libnccl.so.2" "$prefix/nccl/lib/libnccl.so"
  options+=(--with-nccl="$prefix/nccl")
  library_path=$library_path:$wheel_nccl/lib
else
  options+=(--without-nccl)
fi
mpicc=$(command -v mpicc || true)
if [ $mpi = yes ] && [ -n "$mpicc" ]; then
  # UCC's configure looks for mpicc, mpicxx and mpirun in the directory given.
  options+=(--with-mpi="$(dirname "$mpicc")")
else
  options+=(--without-mpi)
fi

echo "build_ucc.sh: configure ${options[*]}" >&2
cd "$work"
mkdir build && cd build
"$src/configure" "${options[@]}" >"$prefix/configure.log" 2>&1 || fail "configure failed ($prefix/configure.log)" "$prefix/configure.log"
make -j"$(nproc)" >"$prefix/make.log" 2>&1 || fail "make failed ($prefix/make.log)" "$prefix/make.log"
make install >"$prefix/install.log" 2>&1 || fail "make install failed ($prefix/install.log)" "$prefix/install.log"

components=(libucc_tl_ucp.so)
[ $cuda_build = no ] || components+=(libucc_mc_cuda.so libucc_ec_cuda.so)
[ $nccl = no ] || components+=(libucc_tl_nccl.so)
for component in "${components[@]}"; do
  [ -e "$prefix/lib/ucc/$component" ] || fail "built without $prefix/lib/ucc/$component (see $prefix/configure.log)"
done
if [ -x "$prefix/bin/ucc_perftest" ]; then
  echo "build_ucc.sh: ucc_perftest built ($prefix/bin/ucc_perftest, MPI of $mpicc)" >&2
elif [ $mpi = no ]; then
  echo "build_ucc.sh: no ucc_perftest (--no-mpi)" >&2
else
  echo "build_ucc.sh: no ucc_perftest (${mpicc:-no mpicc on PATH}; see $prefix/configure.log)" >&2
fi
echo "build_ucc.sh: UCC installed in $prefix" >&2
echo "export UCC_HOME=$prefix"
echo "export LD_LIBRARY_PATH=$library_path\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
