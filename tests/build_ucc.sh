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
# PREFIX: where UCC is installed; the build's logs go to PREFIX/*.log. A new or empty directory, or one an
#   earlier run made (its .build_ucc marker): that build's bin, lib, include, share, etc, nccl, ucx, logs and
#   tests/gpu/prebuild_ucc.sh's PREBUILT and ucc-env.sh are removed first, so that no component of it
#   survives. Any other non-empty directory is refused.
#
# Default: host memory only (TLs ucp and self; no CUDA, NCCL, ROCm, SHARP, verbs).
# --cuda: UCC's CUDA components, CUDA from CUDA_HOME (default /usr/local/cuda), kernels for NVCC_GENCODE
#   (default sm_90: H100, H200); the wheel must carry UCX's CUDA transports (libuct_cuda). tl/cuda also needs
#   nvml.h (CUDA_HOME/include, or a directory added with CPPFLAGS=-I...), else UCC leaves it out. Where no
#   driver library can be linked (a build machine without a GPU), libcuda.so.1 and libnvidia-ml.so.1 are
#   stand-ins made here from cuda.h and nvml.h (every cu*/nvml* function an empty stub), for the link alone:
#   they stay in the build's temporary directory, the libraries record only the sonames, and the driver's
#   own libraries load where UCC runs.
# --nccl (with --cuda): tl/nccl too, against the NCCL of the nvidia-nccl-cu13/-cu12 wheel installed for
#   `python3` (torch's CUDA builds pull it in). NCCL_HOME=DIR (include/nccl.h, lib/libnccl.so*) or
#   NCCL_HOME=WHEEL (an nvidia-nccl-cu13/-cu12 wheel file) builds against that instead, for a UCC that runs on
#   another machine: the LD_LIBRARY_PATH line then asks `python3`, where it is sourced, for its NCCL wheel.
# --no-mpi: no ucc_perftest. Otherwise ucc_perftest (UCC's own benchmark, run under mpirun) is built with the
#   MPI whose mpicc is first on PATH, where there is one.
#
# stdout: only the two lines to export for hpccomm's install and its runs, UCC_HOME and LD_LIBRARY_PATH (the
# wheel's UCX first: Debian's libucx0 and an MPI's own UCX are older, and have no CUDA; with --nccl, the NCCL
# wheel's lib directory too; with --cuda, CUDA_HOME's lib64 last). Progress and errors go to stderr, an error
# with the tail of its log; the exit status is non-zero on failure.
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
if [ -n "$(ls -A "$3" 2>/dev/null)" ] && [ ! -f "$3/.build_ucc" ]; then
  fail "$3 is not empty and tests/build_ucc.sh did not make it (no .build_ucc): give a new or empty PREFIX"
fi
mkdir -p "$3"; prefix=$(realpath "$3")
rm -rf "${prefix:?}"/{bin,lib,include,share,etc,nccl,ucx,PREBUILT,ucc-env.sh} "$prefix"/*.log
echo "made by tests/build_ucc.sh: its next build here removes bin lib include share etc nccl ucx *.log PREBUILT ucc-env.sh" \
  >"$prefix/.build_ucc"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

if [ -f "$src" ]; then
  top=$(tar -tzf "$src" | cut -d/ -f1 | sort -u)
  [ "$(wc -l <<<"$top")" -eq 1 ] || fail "$src should hold one top directory, not: $(tr '\n' ' ' <<<"$top")"
  tar -xzf "$src" -C "$work"
  src=$work/$top
fi
[ -x "$src/configure" ] || fail "$src has no configure script: run its ./autogen.sh first"

# The wheel's UCX: unzipped, its tools (ucx_info) made runnable again (a zip keeps no file modes); its libtool
# archives removed (they name the wheel's build paths) and the prefix in its pkg-config files pointed at where
# it now is.
mkdir -p "$prefix/ucx"
python3 -m zipfile -e "$wheel" "$prefix/ucx" || fail "cannot unzip $wheel (a wheel is a zip file)"
ucx=$prefix/ucx/libucx
[ -d "$ucx/lib" ] || fail "$wheel holds no libucx/lib: not a libucx-cu12/cu13 wheel"
[ ! -d "$ucx/bin" ] || find "$ucx/bin" -type f -exec chmod +x {} +
find "$ucx" -name '*.la' -delete
for pc in "$ucx"/lib/pkgconfig/*.pc; do sed -i "s|^prefix=.*|prefix=$ucx|" "$pc"; done
library_path=$ucx/lib:$prefix/lib

options=(--prefix="$prefix" --with-ucx="$ucx" --without-rocm --without-rccl --without-sharp --without-doca_urom
         --without-ibverbs --without-rdmacm --disable-static)
stubs=""
stub() {  # soname header prefix probe: a link-time stand-in for a driver library that cannot be linked here
  local name=${1%.so.*} cc=${CC:-cc}
  printf 'char %s(void);\nint main(void) { return %s(); }\n' "$4" "$4" >"$work/probe.c"
  # shellcheck disable=SC2086  # CPPFLAGS/LDFLAGS: flags as the user wrote them, as configure takes them
  if "$cc" ${CPPFLAGS:-} "$work/probe.c" -o "$work/probe" ${LDFLAGS:-} -L"$cuda/lib64" -L"$cuda/lib64/stubs" \
       -l"${name#lib}" 2>/dev/null; then return 0; fi
  printf '#include <%s>\n' "$2" >"$work/probe.c"
  # shellcheck disable=SC2086
  "$cc" -E -P -I"$cuda/include" ${CPPFLAGS:-} "$work/probe.c" -o "$work/$name.i" 2>/dev/null || return 0  # no header: UCC leaves it out
  mkdir -p "$work/stubs"; stubs=$work/stubs
  # The functions declared, and the names the header renames (cuFoo to cuFoo_v2): the library has both.
  # shellcheck disable=SC2086
  { grep -oE "\b$3[A-Z][A-Za-z0-9_]* *\(" "$work/$name.i" | tr -d ' ('
    "$cc" -E -dM -I"$cuda/include" ${CPPFLAGS:-} "$work/probe.c" | sed -nE "s/^#define ($3[A-Z][A-Za-z0-9_]*) +$3[A-Z][A-Za-z0-9_]*$/\1/p"
  } | sort -u | sed 's/.*/void &(void) {}/' >"$stubs/$name.c"
  "$cc" -shared -fPIC -Wl,-soname,"$1" -o "$stubs/$name.so" "$stubs/$name.c" || fail "cannot make a stand-in $1"
  ln -sf "$name.so" "$stubs/$1"
  echo "build_ucc.sh: no $name.so to link against: a stand-in with $(wc -l <"$stubs/$name.c") functions from $2, for the link alone" >&2
}
if [ $cuda_build = yes ]; then
  ls "$ucx"/lib/ucx/libuct_cuda.so* >/dev/null 2>&1 || fail "$wheel has no CUDA transports (lib/ucx/libuct_cuda.so)"
  cuda=${CUDA_HOME:-/usr/local/cuda}
  stub libcuda.so.1 cuda.h cu cuInit
  stub libnvidia-ml.so.1 nvml.h nvml nvmlInit_v2
  options+=(--with-cuda="$cuda" --with-nvcc-gencode="${NVCC_GENCODE:--gencode=arch=compute_90,code=sm_90}")
  # -rpath-link: the link of a program against libraries that need the stand-ins finds them too.
  [ -z "$stubs" ] || options+=("LDFLAGS=${LDFLAGS:+$LDFLAGS }-L$stubs -Wl,-rpath-link,$stubs")
else
  options+=(--without-cuda)
fi
# The lib directory of python3's NCCL wheel (nvidia.nccl is a namespace package: its directory comes from
# __path__), after what is given first.
nccl_lib_py() { echo "import os, nvidia.nccl as n; print(\"${1:-}\" + next(d for d in n.__path__ if os.path.exists(d + \"/lib/libnccl.so.2\")) + \"/lib\")"; }
if [ $nccl = yes ]; then
  mkdir -p "$work/nccl/lib"
  if [ -n "${NCCL_HOME:-}" ] && [ -f "$NCCL_HOME" ]; then
    python3 -m zipfile -e "$NCCL_HOME" "$work/nccl-wheel" || fail "NCCL_HOME: cannot unzip $NCCL_HOME"
    nccl_home=$work/nccl-wheel/nvidia/nccl
  else
    nccl_home=${NCCL_HOME:-$(python3 -c "$(nccl_lib_py)" 2>/dev/null | sed 's|/lib$||' || true)}
  fi
  [ -n "$nccl_home" ] || fail "--nccl: $(command -v python3) has no nvidia-nccl-cu13/-cu12 wheel (nvidia/nccl/lib/libnccl.so.2); or set NCCL_HOME"
  [ -f "$nccl_home/include/nccl.h" ] || fail "--nccl: no include/nccl.h in $nccl_home"
  nccl_so=$(ls "$nccl_home"/lib/libnccl.so* 2>/dev/null | head -n 1)
  [ -n "$nccl_so" ] || fail "--nccl: no lib/libnccl.so* in $nccl_home"
  # The wheel has no libnccl.so: links in the build's directory stand for it, for the build alone.
  ln -s "$nccl_home/include" "$work/nccl/include"
  ln -s "$nccl_so" "$work/nccl/lib/libnccl.so"
  options+=(--with-nccl="$work/nccl")
  if [ -z "${NCCL_HOME:-}" ]; then
    library_path=$library_path:$nccl_home/lib
  else  # where the lines are sourced, the lib directory of that python3's NCCL wheel, if it has one
    library_path=$library_path"\$(python3 -c '$(nccl_lib_py :)' 2>/dev/null)"
  fi
else
  options+=(--without-nccl)
fi
[ $cuda_build = no ] || library_path=$library_path:$cuda/lib64  # libcudart.so.13, and libcudart.so (ucc_perftest opens it)
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
"$src/configure" "${options[@]}" >"$prefix/configure.log" 2>&1 \
  || { cp config.log "$prefix/config.log"; fail "configure failed ($prefix/configure.log, config.log)" "$prefix/configure.log"; }
make -j"$(nproc)" >"$prefix/make.log" 2>&1 || fail "make failed ($prefix/make.log)" "$prefix/make.log"
make install >"$prefix/install.log" 2>&1 || fail "make install failed ($prefix/install.log)" "$prefix/install.log"
find "$prefix/lib" -name '*.la' -delete  # libtool archives name this build's temporary directory

components=(libucc_tl_ucp.so)
[ $cuda_build = no ] || components+=(libucc_mc_cuda.so libucc_ec_cuda.so)
[ $nccl = no ] || components+=(libucc_tl_nccl.so)
for component in "${components[@]}"; do
  [ -e "$prefix/lib/ucc/$component" ] || fail "built without $prefix/lib/ucc/$component (see $prefix/configure.log)"
done
if [ $cuda_build = yes ] && [ ! -e "$prefix/lib/ucc/libucc_tl_cuda.so" ]; then
  echo "build_ucc.sh: no tl/cuda (it needs nvml.h and libnvidia-ml; see $prefix/configure.log)" >&2
fi
if [ -n "$stubs" ]; then
  # Every driver function the libraries call is one the stand-ins define (declared in cuda.h or nvml.h).
  undefined=$(LD_LIBRARY_PATH=$stubs:$ucx/lib:$prefix/lib:$cuda/lib64${nccl_home:+:$nccl_home/lib} \
    ldd -r "$prefix"/lib/*.so "$prefix"/lib/ucc/*.so 2>&1 | grep -E 'undefined symbol: (cu[A-Z]|nvml)' || true)
  [ -z "$undefined" ] || fail "driver functions the stand-ins lack: $undefined"
fi
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
