#!/usr/bin/env bash
# Build UCC with CUDA against the UCX of a libucx-cu12/cu13 wheel: hpccomm's own build script, used by
# tests/gpu/acceptance.sh on the GPU machine and usable on any CUDA machine.
#
#   bash tests/gpu/build_ucc.sh UCC_SOURCE UCX_WHEEL PREFIX
#
# UCC_SOURCE: a UCC source tree on which ./autogen.sh has run (the GPU machine has no libtoolize);
# UCX_WHEEL: a libucx-cu13 (or -cu12) wheel file; PREFIX: where UCC is installed, and the wheel's UCX
# unpacked beside it (PREFIX/ucx). Prints the two lines to export for hpccomm's install and run:
# UCC_HOME and LD_LIBRARY_PATH (the CUDA-capable UCX first: an MPI's own UCX has no CUDA).
# CUDA from CUDA_HOME (default /usr/local/cuda); kernels for NVCC_GENCODE (default sm_90: H100, H200).
# No NCCL (tl/nccl refuses two ranks on one GPU, the acceptance machine's case), no ROCm.
set -euo pipefail
src=$(realpath "$1"); wheel=$(realpath "$2"); prefix=$3
mkdir -p "$prefix"; prefix=$(realpath "$prefix")
cuda=${CUDA_HOME:-/usr/local/cuda}
gencode=${NVCC_GENCODE:--gencode=arch=compute_90,code=sm_90}

# The wheel's UCX: unzipped; its libtool archives removed (they name the wheel's build paths) and the
# prefix in its pkg-config files pointed at where it now is.
rm -rf "$prefix/ucx" && mkdir -p "$prefix/ucx"
python3 -m zipfile -e "$wheel" "$prefix/ucx"
ucx=$prefix/ucx/libucx
find "$ucx" -name '*.la' -delete
for pc in "$ucx"/lib/pkgconfig/*.pc; do sed -i "s|^prefix=.*|prefix=$ucx|" "$pc"; done
ls "$ucx"/lib/ucx/libuct_cuda.so* >/dev/null  # the wheel must carry UCX's CUDA transports

build=$(mktemp -d)
cd "$build"
"$src/configure" --prefix="$prefix" --with-ucx="$ucx" --with-cuda="$cuda" --with-nvcc-gencode="$gencode" \
  --without-nccl --without-rocm --without-rccl --without-sharp --without-doca_urom --without-ibverbs \
  --without-rdmacm --disable-static >"$prefix/configure.log" 2>&1 || { tail -30 "$prefix/configure.log"; exit 1; }
make -j"$(nproc)" >"$prefix/make.log" 2>&1 || { tail -40 "$prefix/make.log"; exit 1; }
make install >"$prefix/install.log" 2>&1 || { tail -20 "$prefix/install.log"; exit 1; }
ls "$prefix"/lib/ucc/libucc_mc_cuda.so "$prefix"/lib/ucc/libucc_ec_cuda.so >/dev/null
echo "export UCC_HOME=$prefix"
echo "export LD_LIBRARY_PATH=$ucx/lib:$prefix/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
