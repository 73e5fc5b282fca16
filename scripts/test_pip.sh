#!/usr/bin/env bash
# The current platform: pip's torch as LibTorch and as the Python peer
# (docs/compatibility.md). Sets up and runs the whole test suite against it:
#  1. a virtual environment of Debian's python3 with torch 2.15.0 (the CUDA
#     wheel: LibTorch with CUDA and NCCL, run on the CPU here) and the real
#     clients the interop tests use (transformers, safetensors, tensorboard,
#     tiktoken; matplotlib for scripts/plot_metrics.py), pinned; made once, cached outside the clone
#     (LOCKSTEP_PIP_ROOT, default /var/cache/lockstep): a second run
#     installs nothing;
#  2. Gloo's headers, which the wheel does not ship: Debian 13's libgloo-dev
#     (the LibTorch 2.x side of ProcessGroupGloo), from the mirror this
#     machine's apt uses, unpacked into the same cache;
#  3. scripts/setup.sh into build-pip/ (CUDA found, the NCCL backend ON),
#     then ctest with that torch's Python as the peer (LOCKSTEP_PYTHON).
# Usage: scripts/test_pip.sh [ctest arguments]
#        LOCKSTEP_PIP_TORCH=2.11.0 scripts/test_pip.sh --build-only   (the GPU kit's torch)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
torch_version=${LOCKSTEP_PIP_TORCH:-2.15.0}
cache=${LOCKSTEP_PIP_ROOT:-/var/cache/lockstep}
venv="$cache/torch-$torch_version"
build=${LOCKSTEP_BUILD_DIR:-build-pip}
[ "$torch_version" = 2.15.0 ] || build=${LOCKSTEP_BUILD_DIR:-build-pip-$torch_version}
packages=("torch==$torch_version" transformers==5.25.0 safetensors==0.8.0 tensorboard==2.21.0
          tiktoken==0.14.0 numpy==2.4.6 matplotlib==3.11.2)
die() { echo "test_pip: $*" >&2; exit 2; }

# 1. The environment.
stamp="$venv/.lockstep-packages"
if [ ! -x "$venv/bin/python" ]; then
  echo "test_pip: making $venv"
  mkdir -p "$cache"
  /usr/bin/python3 -m venv "$venv" || die "cannot make $venv (python3-venv installed?)"
fi
if [ "$(cat "$stamp" 2>/dev/null)" != "${packages[*]}" ]; then
  echo "test_pip: installing ${packages[*]} into $venv"
  "$venv/bin/pip" install -q --disable-pip-version-check "${packages[@]}" ||
    die "pip could not install ${packages[*]} into $venv"
  echo "${packages[*]}" >"$stamp"
fi
python="$venv/bin/python"

# 2. Gloo's headers.
gloo="$cache/gloo-trixie"
if [ ! -f "$gloo/include/gloo/algorithm.h" ]; then
  source "$here/scripts/lib/debian_mirror.sh"
  mirror=$(debian_mirror)
  [ -n "$mirror" ] || die "no Debian mirror in /etc/apt/sources.list{,.d} for Debian 13's libgloo-dev"
  state=$(mktemp -d)
  trap 'rm -rf "$state"' EXIT
  mkdir -p "$state/lists/partial" "$state/cache/archives/partial" "$state/parts" "$state/deb"
  echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror trixie main" >"$state/sources.list"
  apt_private=(-o "Dir::Etc::SourceList=$state/sources.list" -o "Dir::Etc::SourceParts=$state/parts"
               -o "Dir::State::Lists=$state/lists" -o "Dir::Cache=$state/cache"
               -o "Dir::State::status=/var/lib/dpkg/status" -o "APT::Sandbox::User=root")
  apt-get "${apt_private[@]}" update -qq || die "apt could not read Debian 13's package lists"
  (cd "$state/deb" && apt-get "${apt_private[@]}" download -qq libgloo-dev/trixie) ||
    die "apt could not download Debian 13's libgloo-dev"
  rm -rf "$gloo" && mkdir -p "$gloo"
  dpkg-deb -x "$state"/deb/libgloo-dev_*.deb "$state/x"
  mv "$state/x/usr/include" "$gloo/include"
fi

# 3. Build and test. nvcc and the CUDA toolkit are in /usr/local/cuda; the
# wheel keeps nccl.h and cuDNN under site-packages/nvidia.
cmake_prefix=$("$python" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')
nvidia=$("$python" -c 'import nvidia, os; print(list(nvidia.__path__)[0])')
# The wheel ships fmt (and may ship spdlog) in its include folder, which
# CMake puts first; Debian's spdlog needs Debian's fmt: those go before it.
mkdir -p "$build/first"
ln -sfn /usr/include/fmt "$build/first/fmt"
ln -sfn /usr/include/spdlog "$build/first/spdlog"
torch_lib=$("$python" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')
link_flags=""
for d in "$nvidia"/*/lib; do link_flags="$link_flags -Wl,-rpath-link,$d -L$d"; done
flags="-I$here/$build/first -isystem $gloo/include"
case "$build" in /*) flags="-I$build/first -isystem $gloo/include" ;; esac
# The wheel's nccl.h before the toolkit's (CUDA 13.0 ships NCCL 2.28, the
# wheel 2.30): ProcessGroupNCCL's layout follows NCCL's version macros, and
# compiled against the other one it corrupted the heap of libtorch_cuda.
flags="-I$nvidia/nccl/include $flags"
# (nccl's own folder not among them: GCC drops a -I folder that is also
# given with -idirafter, and the toolkit's older nccl.h would win again)
for d in "$nvidia"/*/include; do [ "$d" = "$nvidia/nccl/include" ] || flags="$flags -idirafter $d"; done
cuda_args=(-DTORCH_CUDA_ARCH_LIST=9.0 -DCMAKE_CUDA_ARCHITECTURES=90)
command -v nvcc >/dev/null || [ ! -x /usr/local/cuda/bin/nvcc ] || export PATH="/usr/local/cuda/bin:$PATH"
command -v nvcc >/dev/null && cuda_args+=(-DCMAKE_CUDA_COMPILER="$(command -v nvcc)")
for d in /usr/local/cuda/include "$nvidia"/*/include; do
  [ -f "$d/nvtx3/nvToolsExt.h" ] && cuda_args+=(-Dnvtx3_dir="$d" -DUSE_SYSTEM_NVTX=ON) && break
done
cudnn="$nvidia/cudnn"
if [ -f "$cudnn/include/cudnn.h" ]; then
  cuda_args+=(-DCUDNN_INCLUDE_PATH="$cudnn/include" -DCUDNN_LIBRARY_PATH="$(ls "$cudnn"/lib/libcudnn.so* | head -n 1)")
fi
# The settings as a CMake initial cache (paths with spaces survive).
mkdir -p "$build"
{
  echo "set(CMAKE_PREFIX_PATH \"$cmake_prefix\" CACHE STRING \"\" FORCE)"
  echo "set(CMAKE_CXX_FLAGS \"$flags\" CACHE STRING \"\" FORCE)"
  # libtorch_cuda.so needs the wheel's newer libnccl.so.2 (and its other
  # nvidia libraries), not an older one ldconfig may know: the linker is
  # pointed at theirs (the run time finds them through torch's own RPATH).
  echo "set(CMAKE_EXE_LINKER_FLAGS \"$link_flags\" CACHE STRING \"\" FORCE)"
  echo "set(CMAKE_SHARED_LINKER_FLAGS \"$link_flags\" CACHE STRING \"\" FORCE)"
  # A build folder configured once against another LibTorch keeps that
  # one's libraries in its cache: each is named again.
  echo "set(Torch_DIR \"$cmake_prefix/Torch\" CACHE PATH \"\" FORCE)"
  echo "set(Caffe2_DIR \"$cmake_prefix/Caffe2\" CACHE PATH \"\" FORCE)"
  echo "set(c10_LIBRARY \"$torch_lib/libc10.so\" CACHE FILEPATH \"\" FORCE)"
  echo "set(TORCH_LIBRARY \"$torch_lib/libtorch.so\" CACHE FILEPATH \"\" FORCE)"
  echo "set(LOCKSTEP_NCCL ON CACHE STRING \"\" FORCE)"
  for a in "${cuda_args[@]}"; do
    a=${a#-D}
    echo "set(${a%%=*} \"${a#*=}\" CACHE STRING \"\" FORCE)"
  done
} >"$build/pip-platform.cmake"
export LOCKSTEP_BUILD_DIR="$build" LOCKSTEP_CMAKE_ARGS="-C $build/pip-platform.cmake"
export LOCKSTEP_PYTHON="$python" LOCKSTEP_TOOLS_PYTHON="$python"
scripts/setup.sh
[ "${1:-}" = --build-only ] && exit 0
export OMP_NUM_THREADS=1
ctest --test-dir "$build" --output-on-failure -j 2 "$@"
