#!/usr/bin/env bash
# The GPU kit (docs/gpu.md): on a machine with a Python torch 2.x (CUDA or
# not), CMake, ninja and a C++ compiler but no package registries, builds
# lockstep from the dependencies carried in DEPS (scripts/gpu_fetch_deps.sh)
# and runs the unit suite and the CUDA/NCCL checks. Everything goes to one
# log, OUT/gpu_check.log; OUT/summary.md has one line per step with its
# figures. A failed step is recorded and the next one runs; the exit code
# is the number of failed steps (0: all passed or skipped).
#
#   scripts/gpu_check.sh OUT [DEPS]          DEPS default: gpu-deps
#   env: PYTHON (default python3), JOBS (default nproc), LOCKSTEP_TORCH_PREFIX
#        (a CMake prefix holding Torch/TorchConfig.cmake, when the Python
#        torch ships none), LOCKSTEP_GPU_FROM_SOURCE=1 (build the compiled
#        dependencies from their Debian sources even if the binaries run),
#        LOCKSTEP_GPU_QUICK=1 (a rehearsal: one benchmark round; without a
#        GPU, the training and benchmark steps run on the CPU over Gloo as
#        stand-ins, so that their commands and parsing are exercised too)
#
# Steps: environment -> dependencies (unpack with dpkg -x or ar+tar into a
# private prefix, never into /; probe the binaries; build from source what
# does not fit) -> configure (says whether CUDA and NCCL were found) ->
# build (the unit suite against this LibTorch then starts in the
# background, on half the cores) -> the CUDA tests -> ZeRO 1/2/3
# bit-identical to zero 0 -> the unit suite's result (the benchmarks wait
# for it: a quiet machine) -> the 12x768 GPT beside PyTorch's DDP in bf16
# and fp32 (tokens/s, MFU, the step's split) -> silent corruption,
# SyncBatchNorm and the Llama on the GPU -> what the first device run
# showed already (check --comm on NCCL, the GPT against Python's step for
# step, PowerSGD, digits whose checkpoint Python evaluates, the demo's GPT
# shape, every collective, Gloo over CUDA tensors, DDP's MLP benchmark).
# No step starts after LOCKSTEP_GPU_DEADLINE_S (default 480)
# seconds, and every command's time limit is cut to end by
# LOCKSTEP_GPU_LIMIT_S (default the deadline + 90), so a run fits a 600 s
# device call.
# env LOCKSTEP_GPU_ROUNDS: rounds of each GPT benchmark (default 2; 1 quick);
# LOCKSTEP_GPU_ONLY=REGEX: only the steps whose names match (after the build),
# for a rerun of failed steps in what is left of the device's time.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
[ $# -ge 1 ] || { echo "usage: $0 OUT [DEPS]" >&2; exit 2; }
out=$(realpath -m "$1")
deps=$(realpath -m "${2:-$root/gpu-deps}")
PYTHON=${PYTHON:-python3}
JOBS=${JOBS:-$(nproc)}
build=$root/build-gpu
prefix=$build/deps
mkdir -p "$out" "$build"
log=$out/gpu_check.log
summary=$out/summary.md
# Work files (per-step outputs, training runs) stay in build-gpu/work: OUT
# holds only the log (every step's output is copied into it) and the
# summary, since a device returns few files.
work=$build/work
rm -rf "$work" && mkdir -p "$work"
: >"$log"
echo "# gpu_check $(date -u +%Y-%m-%dT%H:%MZ)" >"$summary"
failed=0

say() { echo "$*" | tee -a "$log" >&2; }
record() {  # record STATUS NAME SECONDS DETAILS
  printf '| %s | %s | %ss | %s |\n' "$1" "$2" "$3" "${4//|/\\|}" >>"$summary"  # a | inside would split the row
  say "== $1: $2 ($3 s) $4"
  [ "$1" = FAIL ] && failed=$((failed + 1))
  return 0
}
# step NAME FUNCTION: runs it with its output in the log; its last line
# starting with "figures:" goes to the summary; exit 77 means skipped.
step() {
  local name=$1 fn=$2 start=$SECONDS rc figures
  say "== $name"
  case $name in environment | dependencies | configure | build) ;; *)
    if [ -n "${LOCKSTEP_GPU_ONLY:-}" ] && ! [[ $name =~ $LOCKSTEP_GPU_ONLY ]]; then
      record SKIP "$name" 0 "not selected (LOCKSTEP_GPU_ONLY=$LOCKSTEP_GPU_ONLY)"
      return 77
    fi ;;
  esac
  if [ "$SECONDS" -ge "$deadline" ]; then
    record SKIP "$name" 0 "not started: the run is past ${deadline} s (LOCKSTEP_GPU_DEADLINE_S), the device's time"
    return 77
  fi
  "$fn" >"$work/step.out" 2>&1
  rc=$?
  stand_in=""
  cat "$work/step.out" >>"$log"
  figures=$(grep '^figures:' "$work/step.out" | tail -n 1 | cut -d' ' -f2-)
  case $rc in
    0) record PASS "$name" $((SECONDS - start)) "$figures" ;;
    77) record SKIP "$name" $((SECONDS - start)) "$figures" ;;
    *) record FAIL "$name" $((SECONDS - start)) "exit $rc; $(tail -n 3 "$work/step.out" | tr '\n' ' ' | cut -c1-300)" ;;
  esac
  rm -f "$work/step.out"
  return $rc
}
printf '| status | step | time | figures |\n| --- | --- | --- | --- |\n' >>"$summary"
# No step starts after this many seconds into the run (LOCKSTEP_GPU_DEADLINE_S); each has its own
# time limit below, so the run ends inside the device's per-call limit.
deadline=${LOCKSTEP_GPU_DEADLINE_S:-480}
# ... and each command's time limit is cut to end before this many seconds
# (LOCKSTEP_GPU_LIMIT_S; default 570: a 600 s call with room for the kill).
hard=${LOCKSTEP_GPU_LIMIT_S:-$((deadline + 90))}
cap() {  # cap SECONDS: SECONDS, or what is left before $hard if less (1 when none)
  local left=$((hard - SECONDS - 5))
  [ "$left" -lt 1 ] && left=1
  echo $(($1 < left ? $1 : left))
}
stand_in=""  # "CPU stand-in: " before the figures of a step that ran on the CPU

# ------------------------------------------------------------ environment
has_gpu=0
for d in /usr/local/nvidia/bin /usr/local/cuda/bin; do
  [ -d "$d" ] && case ":$PATH:" in *":$d:"*) ;; *) PATH=$PATH:$d ;; esac
done
export PATH
torch_include=$("$PYTHON" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "include"))' 2>/dev/null)
env_report() {
  uname -a
  echo "cores: $(nproc)"
  command -v nvidia-smi >/dev/null && nvidia-smi && has_gpu=1
  "$PYTHON" - <<'PY' || return 1
import torch, torch.utils
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
print("cxx11 abi", int(torch._C._GLIBCXX_USE_CXX11_ABI))
print("cmake prefix", torch.utils.cmake_prefix_path)
if torch.cuda.is_available():
    print("nccl", torch.cuda.nccl.version(), "gpu", torch.cuda.get_device_name(0))
PY
  cmake --version | head -n 1
  ninja --version
  c++ --version | head -n 1
  command -v nvcc >/dev/null && { command -v nvcc; nvcc --version | tail -n 1; }
  echo "torch include: $torch_include"
  ls -d "$torch_include"/fmt "$torch_include"/gloo "$torch_include"/spdlog 2>/dev/null
  echo "figures: $("$PYTHON" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)')"
}
step "environment" env_report || { say "no usable Python torch: stop"; exit 1; }
command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1 && has_gpu=1
"$PYTHON" -c 'import sys, torch; sys.exit(not torch.cuda.is_available())' 2>/dev/null && has_gpu=1
abi=$("$PYTHON" -c 'import torch; print(int(torch._C._GLIBCXX_USE_CXX11_ABI))')

# ------------------------------------------------------------ dependencies
unpack() {  # unpack DEB: dpkg -x where dpkg exists, else ar + tar
  if command -v dpkg-deb >/dev/null; then
    dpkg-deb -x "$1" "$prefix"
  else
    local tmp
    tmp=$(mktemp -d)
    (cd "$tmp" && ar x "$1" && tar -xf data.tar.* -C "$prefix") || return 1
    rm -rf "$tmp"
  fi
}
lib=$prefix/usr/lib/x86_64-linux-gnu
# Debian keeps architecture-specific headers (OpenSSL's opensslconf.h) in a
# multiarch folder that only the system's own /usr/include/<triplet> search
# covers: name it for the carried prefix.
arch_include=$prefix/usr/include/x86_64-linux-gnu
# Builds one upstream tarball from DEPS/sources into $prefix/usr.
from_source() {  # from_source NAME
  local name=$1 src tarball
  tarball=$(ls "$deps/sources/${name}"_*.orig.tar.* 2>/dev/null | grep -v '\.asc$' | head -n 1)
  [ -n "$tarball" ] || { echo "no source of $name in $deps/sources"; return 1; }
  src=$build/src/$name
  rm -rf "$src" && mkdir -p "$src"
  tar -xf "$tarball" -C "$src" --strip-components=1 || return 1
  local flags="-O2 -fPIC -D_GLIBCXX_USE_CXX11_ABI=$abi"
  echo "building $name from $(basename "$tarball")"
  case $name in
    openssl)
      command -v perl >/dev/null && perl -MFindBin -e 1 2>/dev/null ||
        { echo "OpenSSL's build needs a full perl, which this machine lacks"; return 1; }
      (cd "$src" && ./Configure --prefix="$prefix/usr" --libdir=lib/x86_64-linux-gnu no-tests >/dev/null &&
        make -j"$JOBS" build_libs >/dev/null && make install_dev >/dev/null) ;;
    zlib)
      (cd "$src" && CFLAGS="-O2 -fPIC" ./configure --prefix="$prefix/usr" --libdir="$lib" >/dev/null &&
        make -j"$JOBS" >/dev/null && make install >/dev/null) ;;
    xxhash)
      (cd "$src" && make -j"$JOBS" lib >/dev/null && make PREFIX="$prefix/usr" LIBDIR="$lib" install >/dev/null) ;;
    *)
      cmake -S "$src" -B "$src/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_INSTALL_PREFIX="$prefix/usr" -DCMAKE_INSTALL_LIBDIR=lib/x86_64-linux-gnu \
        -DCMAKE_PREFIX_PATH="$prefix/usr" -DCMAKE_CXX_FLAGS="$flags" -DBUILD_SHARED_LIBS=ON \
        -DCMAKE_POLICY_VERSION_MINIMUM=3.5 \
        -DFMT_TEST=OFF -DFMT_DOC=OFF -DSPDLOG_FMT_EXTERNAL=ON -DSPDLOG_BUILD_SHARED=ON \
        -DSPDLOG_BUILD_EXAMPLE=OFF -DYAML_CPP_BUILD_TESTS=OFF -DYAML_CPP_BUILD_TOOLS=OFF \
        -DYAML_BUILD_SHARED_LIBS=ON >/dev/null &&
        cmake --build "$src/build" -j "$JOBS" >/dev/null && cmake --install "$src/build" >/dev/null ;;
  esac
}
# A pip torch ships its own fmt (and maybe spdlog) headers; spdlog 1.10
# compiled against fmt 11 fails. The carried fmt and spdlog go in a folder
# searched with -I, before every -isystem one (the torch's included).
first_includes() {
  if [ -d "$torch_include/fmt" ] || [ -d "$torch_include/spdlog" ]; then
    mkdir -p "$build/first"
    ln -sfn "$prefix/usr/include/fmt" "$build/first/fmt"
    ln -sfn "$prefix/usr/include/spdlog" "$build/first/spdlog"
    echo "-I$build/first"
  fi
}
# Does a program linking the carried libraries build and run here, with
# this torch's C++ ABI?
probe() {
  local dir=$build/probe
  mkdir -p "$dir"
  cat >"$dir/probe.cpp" <<'CPP'
#include <openssl/evp.h>
#include <spdlog/spdlog.h>
#include <xxhash.h>
#include <yaml-cpp/yaml.h>
#include <zlib.h>
int main() {
  auto node = YAML::Load("a: 1");
  spdlog::info("probe {} {} {}", node["a"].as<int>(), zlibVersion(), XXH64("x", 1, 0));
  return EVP_sha256() == nullptr;
}
CPP
  c++ -std=c++17 -D_GLIBCXX_USE_CXX11_ABI="$abi" -DSPDLOG_FMT_EXTERNAL $(first_includes) -I"$prefix/usr/include" -I"$arch_include" -isystem "$torch_include" \
    "$dir/probe.cpp" -o "$dir/probe" -L"$lib" -Wl,-rpath,"$lib" \
    -lyaml-cpp -lspdlog -lfmt -lcrypto -lz -lxxhash && "$dir/probe"
}
# OpenSSL 3 keeps its ABI across 3.x. Where this machine has its own
# libcrypto.so.3 (any Python does), link that one: a carried copy on the
# RPATH would shadow it for the libssl that the torch's libraries load,
# which may need a newer libcrypto (seen in the rehearsal: OPENSSL_3.4.0).
system_ssl=0
use_system_openssl() {
  local sys dir
  sys=$(ldconfig -p 2>/dev/null | awk '$1 == "libcrypto.so.3" && $NF ~ /^\// {print $NF; exit}')
  [ -n "$sys" ] || { echo "OpenSSL: the carried libcrypto.so.3 (this machine has none)"; return 0; }
  dir=$(dirname "$sys")
  [ -e "$dir/libssl.so.3" ] || return 0
  rm -f "$lib/libcrypto.so.3" "$lib/libssl.so.3"
  ln -sf "$dir/libcrypto.so.3" "$lib/libcrypto.so"
  ln -sf "$dir/libssl.so.3" "$lib/libssl.so"
  system_ssl=1
  echo "OpenSSL: this machine's $sys (the carried 3.0 headers, same ABI)"
}
dependencies() {
  [ -d "$deps/debs" ] || { echo "no $deps/debs: run scripts/gpu_fetch_deps.sh on a Debian machine and carry the folder"; return 1; }
  (cd "$deps" && sha256sum -c --quiet SHA256SUMS) || { echo "$deps does not match its SHA256SUMS"; return 1; }
  rm -rf "$prefix" && mkdir -p "$prefix"
  local d
  for d in "$deps"/debs/*.deb; do unpack "$d" || { echo "cannot unpack $d"; return 1; }; done
  # Gloo's headers apart: only used when the torch ships none.
  mkdir -p "$prefix/gloo-include" && mv "$prefix/usr/include/gloo" "$prefix/gloo-include/"
  use_system_openssl
  local how="Debian 12 binaries"
  if [ "${LOCKSTEP_GPU_FROM_SOURCE:-0}" = 1 ] || [ "$abi" != 1 ] || ! probe; then
    echo "the carried binaries do not fit here (or LOCKSTEP_GPU_FROM_SOURCE=1): building from source"
    local n
    for n in zlib openssl xxhash fmtlib spdlog yaml-cpp; do
      [ "$n" = openssl ] && [ "$system_ssl" = 1 ] && continue
      from_source "$n" || return 1
    done
    probe || { echo "the probe fails even with the libraries built here"; return 1; }
    how="built from Debian 12 sources"
  fi
  echo "figures: $how, torch C++11 ABI $abi"
}
step "dependencies" dependencies || { say "no dependencies: stop"; exit 1; }

# ------------------------------------------------------------ configure, build
torch_prefix=$("$PYTHON" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')
torch_note="Python torch's CMake prefix ($torch_prefix)"
if [ ! -f "$torch_prefix/Torch/TorchConfig.cmake" ]; then
  torch_prefix=${LOCKSTEP_TORCH_PREFIX:-/usr/lib/x86_64-linux-gnu/cmake}
  torch_note="LibTorch's CMake prefix $torch_prefix (the Python torch ships no TorchConfig.cmake)"
fi
configure() {
  echo "$torch_note"
  local extra cuda_args=() nccl_include
  extra="$(first_includes) -isystem $arch_include"
  # pip keeps nccl.h (and cuBLAS/cuSPARSE headers that ATen's CUDA headers
  # include) in site-packages/nvidia/*/include, outside torch's include.
  nccl_include=$("$PYTHON" -c 'import os, nvidia.nccl as n; print(os.path.join(list(n.__path__)[0], "include"))' 2>/dev/null)
  # -I, not -isystem: before /usr/local/cuda/include, whose nccl.h may be
  # another NCCL version than the wheel's (ProcessGroupNCCL's layout
  # follows NCCL's version macros: scripts/test_pip.sh).
  [ -f "$nccl_include/nccl.h" ] && extra="-I$nccl_include $extra" && echo "nccl.h: $nccl_include"
  local d
  for d in $("$PYTHON" -c 'import glob, os, nvidia; print(" ".join(glob.glob(os.path.join(list(nvidia.__path__)[0], "*", "include"))))' 2>/dev/null); do
    # not nccl's: GCC drops a -I folder also given with -idirafter
    [ "$d" = "$nccl_include" ] || extra="$extra -idirafter $d"
  done
  if [ "$has_gpu" = 1 ] && command -v nvcc >/dev/null; then
    local cap
    cap=$("$PYTHON" -c 'import torch; print("%d.%d" % torch.cuda.get_device_capability(0))' 2>/dev/null)
    cuda_args=(-DCMAKE_CUDA_COMPILER="$(command -v nvcc)")
    [ -n "$cap" ] && cuda_args+=(-DTORCH_CUDA_ARCH_LIST="$cap" -DCMAKE_CUDA_ARCHITECTURES="${cap/./}")
    # Caffe2's cuda.cmake looks for NVTX3 (header-only since CUDA 12.9) and
    # cuDNN in the toolkit's folders; a pip torch's live in site-packages.
    local nvtx="" cudnn
    for d in /usr/local/cuda/include "$torch_include" $("$PYTHON" -c 'import glob, os, nvidia; print(" ".join(glob.glob(os.path.join(list(nvidia.__path__)[0], "*", "include"))))' 2>/dev/null); do
      [ -f "$d/nvtx3/nvToolsExt.h" ] && nvtx=$d && break
    done
    [ -n "$nvtx" ] && cuda_args+=(-Dnvtx3_dir="$nvtx" -DUSE_SYSTEM_NVTX=ON) && echo "nvtx3: $nvtx"
    cudnn=$("$PYTHON" -c 'import nvidia.cudnn as c; print(list(c.__path__)[0])' 2>/dev/null)
    if [ -f "$cudnn/include/cudnn.h" ] && ls "$cudnn"/lib/libcudnn.so* >/dev/null 2>&1; then
      cuda_args+=(-DCUDNN_INCLUDE_PATH="$cudnn/include" -DCUDNN_LIBRARY_PATH="$(ls "$cudnn"/lib/libcudnn.so* | head -n 1)")
      echo "cuDNN: $cudnn"
    fi
  fi
  local nccl=AUTO
  if ! [ -f "$nccl_include/nccl.h" ] && ! [ -f /usr/include/nccl.h ] && ! [ -f /usr/local/cuda/include/nccl.h ]; then
    nccl=OFF
    echo "no nccl.h anywhere: the NCCL backend is left out (LOCKSTEP_NCCL=OFF)"
  fi
  if [ ! -f "$torch_include/gloo/algorithm.h" ] && [ ! -f /usr/include/gloo/algorithm.h ]; then
    extra="$extra -isystem $prefix/gloo-include"
    echo "gloo headers: carried (Debian 13's libgloo-dev)"
  else
    echo "gloo headers: the torch's own"
  fi
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLOCKSTEP_INSTALL=OFF \
    -DCMAKE_PREFIX_PATH="$torch_prefix;$prefix/usr" -DOPENSSL_INCLUDE_DIR="$prefix/usr/include" \
    -DOPENSSL_CRYPTO_LIBRARY="$lib/libcrypto.so" -DOPENSSL_SSL_LIBRARY="$lib/libssl.so" \
    -DZLIB_ROOT="$prefix/usr" -DXXHASH_INCLUDE_DIR="$prefix/usr/include" \
    -DXXHASH_LIBRARY="$lib/libxxhash.so" -Dspdlog_DIR="$lib/cmake/spdlog" -Dfmt_DIR="$lib/cmake/fmt" \
    -Dyaml-cpp_DIR="$lib/cmake/yaml-cpp" -Dcxxopts_DIR="$prefix/usr/lib/cmake/cxxopts" \
    -DCatch2_DIR="$prefix/usr/lib/cmake/Catch2" -DLOCKSTEP_MPI=OFF -DLOCKSTEP_NCCL="$nccl" "${cuda_args[@]}" \
    -DCMAKE_CXX_FLAGS="$extra" -DCMAKE_BUILD_RPATH="$lib" \
    2>&1 | tee "$build/configure.txt"
  [ "${PIPESTATUS[0]}" = 0 ] || return 1
  local line
  line=$(grep -o 'lockstep: LibTorch [^ ]*, NCCL backend: [A-Z]*, MPI backend: [A-Z]*' "$build/configure.txt")
  echo "figures: $line; CUDA: $(grep -q 'TORCH_CUDA\|Found CUDA' "$build/configure.txt" && echo found || echo 'not found')"
}
step "configure" configure || { say "configure failed: stop"; exit 1; }
compile() {
  # The binaries of an earlier call (a warm machine keeps build-gpu) go
  # first: a failed link must not leave old ones for the steps below.
  rm -f "$build/lockstep" "$build/lockstep-run" "$build/tests/lockstep_tests"
  # -k 0: every error of one call shown at once, and whatever else builds
  # is built (the steps below that need only lockstep run even if a test
  # file does not compile).
  cmake --build "$build" -j "$JOBS" -- -k 0
  local rc=$?
  echo "figures: $(ls "$build"/lockstep "$build"/lockstep-run "$build"/tests/lockstep_tests 2>/dev/null | wc -l) of 3 binaries, $JOBS jobs"
  return $rc
}
step "build" compile
[ -x "$build/lockstep" ] && [ -x "$build/lockstep-run" ] || { say "no lockstep binaries: stop"; exit 1; }

# ------------------------------------------------------------ tests and checks
# The steps are defined here and run at the end ("the run"), in the order
# of what the device's time is worth.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} USE_LIBUV=0
run=$build/lockstep-run
bin=$build/lockstep
quick=${LOCKSTEP_GPU_QUICK:-0}
rounds=${LOCKSTEP_GPU_ROUNDS:-$([ "$quick" = 1 ] && echo 1 || echo 2)}
# where: the device of a step that needs a GPU: dev=cuda, with world1=nccl
# for one rank. Without a GPU, in a rehearsal (LOCKSTEP_GPU_QUICK=1), the
# CPU over Gloo stands in, so that the step's commands and checks run;
# otherwise the step is skipped (77).
where() {
  if [ "$has_gpu" = 1 ]; then
    dev=cuda world1=nccl
    return 0
  fi
  [ "$quick" = 1 ] || { echo "figures: no GPU"; return 77; }
  echo "no GPU: the CPU stand-in of this step (a rehearsal)"
  dev=cpu world1=gloo stand_in="CPU stand-in: "
}
cuda_tests() {
  where || return 77
  # A filter that matches nothing must fail: Catch2 v2.13 needs -w NoTests
  # for that (v3 fails by default and does not know the option).
  local one="" ranks strict=()
  "$build/tests/lockstep_tests" -w NoTests --list-test-names-only 2>&1 | grep -q "Unrecognised warning option" ||
    strict=(-w NoTests)
  if [ "$dev" = cuda ]; then
    timeout -k 5 "$(cap 120)" "$build/tests/lockstep_tests" "${strict[@]}" "[.cuda]" && one=passed || one=FAILED
  fi
  # DDP on two processes sharing the GPU (Note [Two ranks of DDP on one GPU]).
  LOCKSTEP_TEST_DEVICE=$dev timeout -k 5 "$(cap 120)" "$run" --nproc-per-node 2 --master-port 0 \
    "$build/tests/lockstep_tests" "${strict[@]}" "[.cuda_ranks]" && ranks=passed || ranks=FAILED
  echo "figures: ${stand_in}${one:+the [.cuda] cases $one, }[.cuda_ranks] (DDP, 2 processes on $dev, 3 steps against one process on the whole batch) $ranks"
  [ "${one:-passed}" = passed ] && [ "$ranks" = passed ]
}
# comm_check FILE CMD...: one communication self-check; the summary line of
# its table becomes the step's figures.
comm_check() {
  [ "$has_gpu" = 1 ] || { echo "figures: no GPU"; return 77; }
  local file=$work/$1
  shift
  timeout -k 5 "$(cap 120)" "$@" >"$file" 2>&1
  local rc=$?
  cat "$file"
  echo "figures: $(grep -o 'comm check (.*' "$file" | head -n 1)"
  return $rc
}
comm_nccl() { comm_check comm_nccl.txt "$bin" check --comm --backend nccl --device cuda; }

# lockstep's GPT on the GPU (DDP over NCCL at world 1) against the same GPT
# in Python on the same GPU, step for step: tests/multiproc/gpt_python.sh's
# comparison (tests/python/gpt_parity.py) and its bounds.
gpt_parity() {
  where || return 77
  local text=$root/data/kjv.txt dir=$work/gpt_parity
  [ -f "$text" ] || { echo "no $text: make it here with scripts/make_text.sh and carry it (docs/gpu.md)"; return 1; }
  mkdir -p "$dir" && head -c 100000 "$text" >"$dir/text.txt"
  local shape=(--n_layer 2 --n_head 2 --n_embd 64 --block_size 32 --batch_size 8 --steps 50 --seed 3
               --lr 0.002 --weight_decay 0.1 --clip 1.0 --validation_fraction 0.1)
  timeout -k 5 "$(cap 60)" "$PYTHON" "$root/tests/python/gpt_parity.py" init "$dir/init.pt" "${shape[@]}" || return 1
  timeout -k 5 "$(cap 120)" "$run" --nproc-per-node 1 --master-port 0 "$bin" train --config "$root/configs/gpt-text.yaml" \
    --set run.dir="$dir/runs" --set run.name=parity --set data.path="$dir/text.txt" --set model.n_layer=2 \
    --set model.n_head=2 --set model.n_embd=64 --set model.block_size=32 --set data.batch_size=8 \
    --set train.max_steps=50 --set run.seed=3 --set optim.lr=0.002 --set optim.weight_decay=0.1 \
    --set optim.beta2=0.999 --set optim.schedule=constant --set optim.warmup_steps=0 \
    --set train.clip_grad_norm=1.0 --set log.every=1 --set checkpoint.every=50 \
    --set model.init_from="$dir/init.pt" --set train.device="$dev" --set dist.backend="$world1" \
    >"$dir/train.out" 2>&1 || { tail -n 20 "$dir/train.out"; return 1; }
  grep -E "model: |backend" "$dir/train.out" | head -n 4
  local ckpt=$dir/runs/parity/checkpoints/step_00000050 prompt="And God said, Let"
  timeout -k 5 "$(cap 60)" "$bin" generate --checkpoint "$ckpt" --prompt "$prompt" --temperature 0 --max-new-tokens 40 \
    >"$dir/generated" 2>"$dir/generate.err" || { cat "$dir/generate.err"; return 1; }
  timeout -k 5 "$(cap 120)" "$PYTHON" "$root/tests/python/gpt_parity.py" compare "$dir/init.pt" "${shape[@]}" \
    --text "$dir/text.txt" --metrics "$dir/runs/parity/metrics.jsonl" --checkpoint "$ckpt/model.pt" \
    --generated "$dir/generated" --prompt "$prompt" --device "$dev" >"$dir/parity" 2>&1 || { cat "$dir/parity"; return 1; }
  cat "$dir/parity"
  local rel diff
  rel=$(sed -n 's/.*largest relative difference \([0-9.e+-]*\).*/\1/p' "$dir/parity")
  diff=$(sed -n 's/.*largest difference after 50 steps \([0-9.e+-]*\).*/\1/p' "$dir/parity")
  echo "figures: ${stand_in}50 AdamW steps on $dev ($world1) beside Python's on $dev: losses within ${rel:-?} (relative), weights within ${diff:-?}; greedy continuation $(sed -n 's/^greedy: //p' "$dir/parity" | cut -c1-60)"
  # gpt_python.sh's bounds: losses 1e-5 (relative), weights half an AdamW step.
  awk -v r="${rel:-1}" -v d="${diff:-1}" 'BEGIN{exit !(r < 1e-5 && d < 1e-3)}' ||
    { echo "beyond the bounds (losses 1e-5 relative, weights 1e-3)"; return 1; }
  grep -q '^greedy: equal$' "$dir/parity" || { echo "the greedy continuations differ"; return 1; }
}

weights() { grep -o "final weights [0-9a-f]*" "$work/$1.out" | tail -n 1 | awk '{print $3}'; }
# digits NAME NPROC ARGS...: digits on $dev, output in $work/NAME.out.
digits() { train_on_dev digits.yaml "$@"; }
# train_on_dev CONFIG NAME NPROC ARGS...: lockstep train with configs/CONFIG
# on $dev, output in $work/NAME.out (its tail shown when it fails).
train_on_dev() {
  local config=$1 name=$2 nproc=$3
  shift 3
  timeout -k 5 "$(cap 90)" "$run" --nproc-per-node "$nproc" --master-port 0 "$bin" train --config "$root/configs/$config" \
    --set run.dir="$work/runs" --set run.name="$name" --set log.progress=plain --set train.device="$dev" \
    "$@" >"$work/$name.out" 2>&1 || { tail -n 15 "$work/$name.out"; return 1; }
}
# optim.zero 1, 2 and 3 end bit-identical to optim.zero 0 (the "final
# weights" fingerprint), AdamW with clipping, as tests/multiproc/zero.sh and
# zero3.sh on the CPU: 2 ranks sharing the GPU through Gloo (NCCL refuses two
# ranks on one GPU), each owning half, and zero 3 at world 1 over NCCL.
zero_gpu() {
  where || return 77
  local z w0 w got="" bad=0 one_ok=1
  local settings=(--set optim.name=adamw --set optim.lr=0.003 --set optim.weight_decay=0.05
                  --set train.clip_grad_norm=0.5 --set train.max_steps=40 --set checkpoint.every=0)
  for z in 0 1 2 3; do
    digits "zero2_$z" 2 "${settings[@]}" --set dist.backend=gloo --set optim.zero="$z" || return 1
  done
  w0=$(weights zero2_0)
  [ -n "$w0" ] || { echo "no final weights in zero2_0.out"; return 1; }
  for z in 1 2 3; do
    w=$(weights "zero2_$z")
    [ "$w" = "$w0" ] && got="$got $z" || { echo "optim.zero $z: final weights $w, zero 0's $w0"; bad=1; }
  done
  grep -h "this rank owns" "$work"/zero2_*.out | head -n 3
  for z in 0 3; do
    digits "zero1_$z" 1 "${settings[@]}" --set dist.backend="$world1" --set optim.zero="$z" || return 1
  done
  w=$(weights zero1_3)
  [ -n "$w" ] && [ "$w" = "$(weights zero1_0)" ] || { echo "world 1: zero 3 $w, zero 0 $(weights zero1_0)"; bad=1 one_ok=0; }
  echo "figures: ${stand_in}digits, AdamW + clipping, 40 steps: optim.zero${got:- none of 1 2 3} bit-identical to 0 on 2 ranks (gloo over $dev), zero 3 $([ "$one_ok" = 1 ] && echo "=" || echo "differs from") 0 at world 1 ($world1); zero 0's weights $w0"
  return $bad
}

# PowerSGD (ddp.comm_hook: powersgd) on the GPU, 2 ranks through Gloo, as
# tests/multiproc/powersgd.sh's first part: within 0.01 of the all-reduce
# run's accuracy, >= 4x fewer bytes per step after start_iter.
powersgd_gpu() {
  where || return 77
  local settings=(--set dist.backend=gloo --set log.every=10 --set train.max_steps=200 --set optim.decay_steps=460
                  --set check.every=10)
  digits psgd_plain 2 "${settings[@]}" || return 1
  digits psgd 2 "${settings[@]}" --set ddp.comm_hook=powersgd --set ddp.powersgd.start_iter=10 || return 1
  local a b pb sb
  a=$(grep -o "validation accuracy [0-9.]*" "$work/psgd_plain.out" | tail -n 1 | awk '{print $3}')
  b=$(grep -o "validation accuracy [0-9.]*" "$work/psgd.out" | tail -n 1 | awk '{print $3}')
  bytes() {  # mean comm_bytes_per_step from step 20 on
    timeout -k 5 "$(cap 30)" "$PYTHON" -c "
import json, sys
rs = [json.loads(l) for l in open(sys.argv[1]) if '\"comm_bytes_per_step\"' in l]
rs = [r['comm_bytes_per_step'] for r in rs if r['step'] >= 20]
print(int(sum(rs) / len(rs)) if rs else 0)" "$work/runs/$1/metrics.jsonl"
  }
  pb=$(bytes psgd_plain) sb=$(bytes psgd)
  echo "figures: ${stand_in}digits, 200 steps, 2 ranks (gloo over $dev): accuracy ${b:-?} (all-reduce ${a:-?}), bytes per step $sb (all-reduce $pb)"
  awk -v a="$a" -v b="$b" -v p="$pb" -v s="$sb" 'BEGIN{exit !(b != "" && a != "" && b >= a - 0.01 && s > 0 && p >= 4 * s)}' ||
    { echo "PowerSGD: more than 0.01 below all-reduce's accuracy, or not 4x fewer bytes"; return 1; }
}

train_gpu() {
  local name=$1 nproc=$2
  shift 2
  timeout -k 5 "$(cap 150)" "$run" --nproc-per-node "$nproc" --master-port 0 "$bin" train --config "$root/configs/digits.yaml" \
    --set run.dir="$work/runs" --set run.name="$name" --set train.max_steps=100 --set check.every=1 \
    "$@" >"$work/train_$name.txt" 2>&1 || { cat "$work/train_$name.txt"; return 1; }
  tail -n 5 "$work/train_$name.txt"
  local line acc got
  line=$(grep -o 'validation accuracy [0-9.]*, loss [0-9.]*' "$work/train_$name.txt")
  acc=$(echo "$line" | sed 's/.*accuracy \([0-9.]*\),.*/\1/')
  got=$(timeout -k 5 "$(cap 60)" "$PYTHON" "$root/tests/python/rebuild.py" "$root/docs/models.md" "$root/data/digits.csv.gz" mlp \
    "$work/runs/$name/checkpoints/step_00000100/model.pt" '{"hidden": 128, "layers": 2}') || return 1
  echo "Python on the checkpoint: $got"
  # lockstep evaluated on the GPU, Python on the CPU: one prediction of 359
  # may flip (0.0028).
  awk -v a="$(echo "$got" | awk '{print $1}')" -v b="$acc" 'BEGIN{d=a-b; exit !(d <= 0.003 && d >= -0.003)}' ||
    { echo "Python's accuracy $got differs from lockstep's $acc"; return 1; }
  echo "figures: ${stand_in}100 steps checked every step, $line; the checkpoint in Python: accuracy $(echo "$got" | awk '{printf "%.4f", $1}')"
}
train_nccl() {
  [ "$has_gpu" = 1 ] || { echo "figures: no GPU"; return 77; }
  train_gpu nccl 1 --set dist.backend=nccl
}

# The GPT beside PyTorch's own DDP on the same GPU (scripts/bench_gpt.sh,
# DEVICE=cuda: NCCL at world 1 for both), alternated, with MFU against the
# GPU's measured matrix-product peak (log.mfu) and the datasheet's.
bench_gpt_gpu() {  # bench_gpt_gpu PRECISION "n_layer n_head n_embd block batch" STEPS WARMUP [SPLIT [NONFINITE_ROW]]
  where || return 77
  local precision=$1 shape=$2 steps=$3 warm=$4 split=${5:-0} nonfinite=${6:-0}
  [ "$dev" = cpu ] && shape="2 2 64 64 8" steps=10 warm=3
  local file="$work/bench_gpt_${precision}_${shape// /_}.txt"
  timeout -k 5 "$(cap 200)" env BUILD="$build" PYTHON="$PYTHON" DEVICE="$dev" NPROC=1 ROUNDS="$rounds" STEPS="$steps" \
    WARMUP="$warm" PRECISION="$precision" SHAPE="$shape" MFU=1 ONLY=shm SPLIT="$split" SPLIT_STEPS=20 \
    NONFINITE_ROW="$nonfinite" \
    bash "$root/scripts/bench_gpt.sh" >"$file" 2>&1
  local rc=$?
  cat "$file"
  # The table's rows, then the split's (ms per step, lockstep against PyTorch).
  echo "figures: ${stand_in}$(sed -n '/^GPT (/,/^step split/p' "$file" | sed '1d;/^step split/d' | tr -s ' ' | tr '\n' ';')$(
    awk '/^step split/ {on=1; next} on && $1 != "phase" {printf " %s %s/%s ms", $1, $2, $3}' "$file")"
  return $rc
}
bench_gpt_small_fp32() { bench_gpt_gpu fp32 "4 4 128 128 16" 200 20; }
bench_gpt_small_bf16() { bench_gpt_gpu bf16 "4 4 128 128 16" 200 20; }
# The large shape adds the step's split (SPLIT=1): forward, backward,
# clipping and optimizer, each timed to the device's end, on both sides;
# bf16 also a row without the per-step non-finite check (its host wait
# costs alike in fp32, where the steps are 4x longer).
bench_gpt_large_fp32() { bench_gpt_gpu fp32 "12 12 768 1024 16" 40 10 1 0; }
bench_gpt_large_bf16() { bench_gpt_gpu bf16 "12 12 768 1024 16" 60 10 1 1; }

# Every collective lockstep uses (all-reduce, reduce-scatter, all-gather),
# checked against the closed form at every size on the GPU through NCCL.
# At world 1 lockstep's ProcessGroup skips the exchange: times, no ring.
bench_allreduce() {
  where || return 77
  timeout -k 5 "$(cap 90)" "$bin" bench allreduce --backend "$world1" --backends "$world1" --ops all \
    --max-bytes $((64 << 20)) >"$work/bench_allreduce.txt" 2>&1
  local rc=$?
  cat "$work/bench_allreduce.txt"
  echo "figures: ${stand_in}$(grep -c ' ok$' "$work/bench_allreduce.txt") sizes ok, $(grep -c 'FAIL$' "$work/bench_allreduce.txt") failed, over all-reduce, reduce-scatter, all-gather on $dev ($world1, world 1: no ring to measure, docs/gpu.md)"
  return $rc
}

comm_gloo_cuda() {
  comm_check comm_gloo.txt "$run" --nproc-per-node 2 --master-port 0 "$bin" check --comm --backend gloo --device cuda
}
train_gloo_cuda() {
  where || return 77
  train_gpu gloo2 2 --set dist.backend=gloo --set train.device="$dev"
}

# ------------------------------------------------------------ what landed since the first device run
# lm NAME NPROC ARGS...: configs/gpt-text.yaml (a byte-level GPT, or with
# --set model.name=llama a Llama) on $dev, 300 kB of the text, output in
# $work/NAME.out, checkpoints off unless ARGS set them.
lm() {
  local name=$1 nproc=$2
  shift 2
  [ -f "$work/lm_text.txt" ] || head -c 300000 "$root/data/kjv.txt" >"$work/lm_text.txt"
  train_on_dev gpt-text.yaml "$name" "$nproc" --set data.path="$work/lm_text.txt" --set checkpoint.every=0 \
    --set train.max_steps=30 "$@"
}
text_needed() {
  [ -f "$root/data/kjv.txt" ] || { echo "no data/kjv.txt: make it with scripts/make_text.sh and carry it"; return 1; }
}

# Silent corruption (Note [Silent corruption]) on the GPU. The replay
# recomputes a rank's local gradient and compares its bits, so it holds only
# where the device's backward is deterministic: clean runs with the screen
# and a replay every step must find nothing and end with the weights of the
# same run without them (the digits' MLP, and the GPT, whose attention
# backward is where a GPU may not be deterministic); a grad-flip on rank 1
# at step 10 must be caught at step 10 naming rank 1 (exit 6). 2 ranks
# sharing the GPU through Gloo.
corruption_gpu() {
  where || return 77
  text_needed || return 1
  local every=(--set check.grad_screen=true --set check.replay_every=1) bad=0 figures=""
  local base=(--set dist.backend=gloo --set train.max_steps=30 --set checkpoint.every=0)
  digits sdc_base 2 "${base[@]}" || return 1
  digits sdc_clean 2 "${base[@]}" "${every[@]}" || { echo "digits, replay every step: a false alarm?"; bad=1; }
  if [ "$(weights sdc_clean)" = "$(weights sdc_base)" ] && [ -n "$(weights sdc_base)" ]; then
    figures="digits: 30 replays found nothing, same weights"
  else
    figures="digits: clean run $(weights sdc_clean), without checks $(weights sdc_base)" bad=1
  fi
  # The demo's shape on the GPU; a smaller one for the CPU stand-in (two
  # cores replaying every step of the demo take minutes).
  local gpt=(--set dist.backend=gloo)
  [ "$dev" = cpu ] && gpt+=(--set model.n_layer=2 --set model.n_embd=64 --set model.n_head=2 --set model.block_size=64)
  lm sdc_gpt_base 2 "${gpt[@]}" || return 1
  lm sdc_gpt_clean 2 "${gpt[@]}" "${every[@]}" ||
    { echo "GPT, replay every step: a false alarm (a nondeterministic backward?)"; bad=1; }
  if [ "$(weights sdc_gpt_clean)" = "$(weights sdc_gpt_base)" ] && [ -n "$(weights sdc_gpt_base)" ]; then
    figures="$figures; GPT: 30 replays found nothing, same weights"
  else
    figures="$figures; GPT: false alarm or other weights ($(grep -o 'silent data corruption: step [0-9]*: rank [0-9]*' "$work/sdc_gpt_clean.out" | head -n 1))"
    bad=1
  fi
  # The screen alone, an exponent flip at a step that is no replay step.
  LOCKSTEP_FAULT=grad-flip:rank=1:step=13:bit=30 digits sdc_screen 2 "${base[@]}" --set check.grad_screen=true
  local src=$? screen
  screen=$(grep -o 'silent data corruption: step [0-9]*: rank [0-9]* ([^)]*), found by [a-z._]*' "$work/sdc_screen.out" | head -n 1)
  if [ "$src" -ne 0 ] && [[ $screen == "silent data corruption: step 13: rank 1 ("*"), found by check.grad_screen" ]]; then
    figures="$figures; an exponent flip on rank 1 at step 13: the screen names rank 1 at step 13"
  else
    figures="$figures; an exponent flip on rank 1 at step 13: ${screen:-not caught} (exit $src)" bad=1
  fi
  LOCKSTEP_FAULT=grad-flip:rank=1:step=10 digits sdc_flip 2 "${base[@]}" --set check.replay_every=5
  local rc=$? caught
  caught=$(grep -o 'silent data corruption: step [0-9]*: rank [0-9]* ([^)]*), found by [a-z._]*' "$work/sdc_flip.out" | head -n 1)
  tail -n 4 "$work/sdc_flip.out"
  if [ "$rc" -ne 0 ] && [[ $caught == "silent data corruption: step 10: rank 1 ("*"), found by check.replay_every" ]] &&
    grep -q "exited with code 6" "$work/sdc_flip.out"; then
    figures="$figures; grad-flip on rank 1 at step 10: caught at step 10, rank 1 named, exit 6"
  else
    figures="$figures; grad-flip on rank 1 at step 10: ${caught:-not caught} (exit $rc)" bad=1
  fi
  echo "figures: ${stand_in}2 ranks (gloo over $dev), screen + replay every step: $figures"
  return $bad
}

# SyncBatchNorm (model.sync_batchnorm) on the GPU, by the closed form of
# tests/multiproc/sync_batchnorm.sh: a ResNet trained on 2 ranks with 16
# images each, synchronised, ends with the validation loss of one rank with
# 32 (the same global batches); without synchronisation it does not. TF32
# off (NVIDIA_TF32_OVERRIDE=0: cuDNN's convolutions round through it by
# PyTorch's default); the bound is 1e-3 (the CPU's is 1e-4: other cuDNN
# algorithms for 16 and 32 images add float rounding), and unsynchronised
# must be 10x farther; the figures give the distances.
syncbn_gpu() {
  where || return 77
  local NVIDIA_TF32_OVERRIDE=0
  export NVIDIA_TF32_OVERRIDE
  local shape=(--set model.name=resnet --set model.depth=10 --set model.width=4 --set train.max_steps=30
               --set checkpoint.every=0 --set optim.warmup_steps=0)
  digits bn_one 1 "${shape[@]}" --set dist.backend="$world1" --set data.batch_size=32 || return 1
  digits bn_synced 2 "${shape[@]}" --set dist.backend=gloo --set data.batch_size=16 --set model.sync_batchnorm=true \
    --set check.every=1 || return 1
  digits bn_local 2 "${shape[@]}" --set dist.backend=gloo --set data.batch_size=16 || return 1
  loss() { grep -o "validation accuracy [0-9.]*, loss [0-9.]*" "$work/$1.out" | tail -n 1 | awk '{print $5}'; }
  local a b c
  a=$(loss bn_one) b=$(loss bn_synced) c=$(loss bn_local)
  rel() { awk -v a="$1" -v b="$2" 'BEGIN{d=(a-b)/b; if (d<0) d=-d; printf "%.3g", d}'; }
  echo "figures: ${stand_in}ResNet-10 on the digits, 30 steps: 2 x 16 synchronised (gloo over $dev) $b, 1 x 32 ($world1) $a: $(rel "$b" "$a") apart; unsynchronised $c ($(rel "$c" "$a") apart)"
  [ -n "$a" ] && [ -n "$b" ] && [ -n "$c" ] || { echo "a run printed no validation loss"; return 1; }
  awk -v s="$(rel "$b" "$a")" -v u="$(rel "$c" "$a")" 'BEGIN{exit !(s < 1e-3 && u > 10 * s)}' ||
    { echo "synchronised: not within 1e-3 of one rank on the whole batch, or not 10x closer than unsynchronised"; return 1; }
}

# The Llama decoder on the GPU against the same on the CPU (where
# tests/multiproc/llama.sh holds it to transformers' logits and training):
# 20 AdamW steps with clipping from the same seed, per-step losses within
# 1e-4 (relative); then ZeRO-3 against DDP on 2 ranks sharing the GPU
# (gloo), bit-identical by the final-weights fingerprint, with DDP run
# twice to tell a nondeterministic kernel from a ZeRO fault.
llama_gpu() {
  where || return 77
  text_needed || return 1
  local shape=(--set model.name=llama --set model.n_layer=2 --set model.n_head=4 --set model.n_kv_head=2
               --set model.n_embd=64 --set model.intermediate_size=160 --set model.block_size=64
               --set data.batch_size=8 --set train.max_steps=20 --set log.every=1 --set check.every=1)
  lm llama_cpu 1 "${shape[@]}" --set train.device=cpu --set dist.backend=gloo || return 1
  lm llama_dev 1 "${shape[@]}" --set dist.backend="$world1" || return 1
  local rel
  rel=$(timeout -k 5 "$(cap 30)" "$PYTHON" -c "
import json, sys
def losses(p): return {r['step']: r['loss'] for r in map(json.loads, open(p)) if 'loss' in r}
a, b = losses(sys.argv[1]), losses(sys.argv[2])
assert len(a) == 20 and a.keys() == b.keys(), (len(a), len(b))
print('%.3g' % max(abs(a[s] - b[s]) / abs(a[s]) for s in a))" \
    "$work/runs/llama_cpu/metrics.jsonl" "$work/runs/llama_dev/metrics.jsonl") || return 1
  local zero=(--set dist.backend=gloo --set log.every=10)
  lm llama_ddp 2 "${shape[@]}" "${zero[@]}" || return 1
  lm llama_ddp_again 2 "${shape[@]}" "${zero[@]}" || return 1
  lm llama_z3 2 "${shape[@]}" "${zero[@]}" --set optim.zero=3 || return 1
  local d d2 z
  d=$(weights llama_ddp) d2=$(weights llama_ddp_again) z=$(weights llama_z3)
  echo "figures: ${stand_in}2 layers, GQA 4/2, 20 AdamW steps: $dev's losses within $rel (relative) of the CPU's; ZeRO-3 $([ -n "$z" ] && [ "$z" = "$d" ] && echo "bit-identical to" || echo "differs from") DDP on 2 ranks (gloo over $dev), DDP twice $([ "$d" = "$d2" ] && echo equal || echo "differs: a nondeterministic kernel")"
  awk -v r="$rel" 'BEGIN{exit !(r < 1e-4)}' || { echo "the losses are more than 1e-4 apart"; return 1; }
  [ -n "$d" ] && [ "$z" = "$d" ] || { echo "ZeRO-3 $z, DDP $d, DDP again $d2"; return 1; }
}

# The unit suite (the CUDA tests run in their own step) starts in the
# background right after the build, on half the cores, beside the CUDA tests
# and ZeRO's runs (correctness only); its step waits for it before the
# benchmarks, which want a quiet machine.
unit_name="unit suite (ctest -L unit -LE cuda) against this LibTorch"
unit_pid=""
unit_suite_start() {
  [ -z "${LOCKSTEP_GPU_ONLY:-}" ] || [[ $unit_name =~ $LOCKSTEP_GPU_ONLY ]] || return 0
  local jobs=$((JOBS / 2 > 1 ? JOBS / 2 : 1))
  rm -f "$work/ctest_unit.rc"
  ( timeout -k 5 "$(cap 400)" ctest --test-dir "$build" -L unit -LE cuda -j "$jobs" --output-on-failure \
      --timeout 120 >"$work/ctest_unit.txt" 2>&1
    echo $? >"$work/ctest_unit.rc" ) &
  unit_pid=$!
}
unit_suite() {
  [ -n "$unit_pid" ] || { echo "the unit suite did not start"; return 1; }
  wait "$unit_pid"
  local rc
  rc=$(cat "$work/ctest_unit.rc" 2>/dev/null || echo 1)
  tail -n 25 "$work/ctest_unit.txt"
  echo "figures: $(grep -E '% tests passed' "$work/ctest_unit.txt")"
  return "$rc"
}

bench_ddp() {  # bench_ddp LABEL NPROC BACKEND TORCH_BACKEND DEVICE [MODELS]
  ERRLOG=$work/bench_ddp_$1.err timeout -k 5 "$(cap 120)" env BUILD=$build PYTHON=$PYTHON NPROC=$2 BACKEND=$3 TORCH_BACKEND=$4 DEVICE=$5 ROUNDS=1 \
    MODELS=${6:-small,xl} MODES=local,ddp STEPS=30 WARMUP=10 bash "$root/scripts/bench_ddp.sh" \
    >"$work/bench_ddp_$1.txt" 2>&1
  local rc=$?
  cat "$work/bench_ddp_$1.txt" "$work/bench_ddp_$1.err" 2>/dev/null
  echo "figures: ${stand_in}$(awk '$2 == "ddp" {printf "%s %s/PyTorch %s; ", $1, "lockstep", $7}' "$work/bench_ddp_$1.txt")"
  return $rc
}
bench_nccl() {
  where || return 77
  if [ "$dev" = cpu ]; then bench_ddp gloo_cpu 1 gloo gloo cpu small; else bench_ddp nccl 1 nccl nccl cuda; fi
}

# ------------------------------------------------------------ the run
# In the order of what the device's time is worth (issue order): the CUDA
# tests, ZeRO on the GPU and the unit suite (started in the background
# after the build), the 12x768 GPT beside PyTorch's with its step split,
# what landed since the first device run; then what the first device run
# has already shown.
unit_suite_start
step "CUDA tests ([.cuda])" cuda_tests
step "ZeRO 1, 2, 3 bit-identical to zero 0 on the GPU" zero_gpu
step "$unit_name" unit_suite
step "GPT 12x768, block 1024, batch 16, bf16, beside PyTorch's DDP (nccl, world 1)" bench_gpt_large_bf16
step "GPT 12x768, block 1024, batch 16, fp32, beside PyTorch's DDP" bench_gpt_large_fp32
step "silent corruption on the GPU: replay and screen, clean and injected" corruption_gpu
step "SyncBatchNorm on the GPU: 2 x 16 synchronised = 1 x 32" syncbn_gpu
step "the Llama decoder on the GPU against the CPU; ZeRO-3 = DDP" llama_gpu
step "check --comm --backend nccl --device cuda (world 1)" comm_nccl
step "the GPT on the GPU beside Python's, step for step (nccl, world 1)" gpt_parity
step "PowerSGD on the GPU (gloo over CUDA, 2 ranks)" powersgd_gpu
step "train digits on the GPU (nccl, world 1), Python evaluates the checkpoint" train_nccl
step "GPT demo shape (4x128, block 128, batch 16), fp32, beside PyTorch's DDP" bench_gpt_small_fp32
step "GPT demo shape, bf16, beside PyTorch's DDP" bench_gpt_small_bf16
step "bench allreduce --backends nccl --ops all (every collective, checked)" bench_allreduce
step "check --comm --backend gloo --device cuda (2 ranks)" comm_gloo_cuda
step "train digits on the GPU (gloo over CUDA, 2 ranks), Python evaluates the checkpoint" train_gloo_cuda
step "bench ddp beside PyTorch's DDP (MLPs; nccl, world 1)" bench_nccl

say "gpu_check: $failed step(s) failed; summary in $summary"
cat "$summary" >&2
exit "$failed"
