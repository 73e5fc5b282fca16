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
# build -> unit suite (ctest -L unit, the CUDA tests included) -> comm
# checks (nccl at world 1; gloo over CUDA tensors, 2 ranks) -> training on
# the GPU (per-step checks, checkpoint loaded and evaluated in Python) ->
# DDP benchmark beside PyTorch's DDP -> all-reduce benchmark.
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
  printf '| %s | %s | %ss | %s |\n' "$1" "$2" "$3" "$4" >>"$summary"
  say "== $1: $2 ($3 s) $4"
  [ "$1" = FAIL ] && failed=$((failed + 1))
  return 0
}
# step NAME FUNCTION: runs it with its output in the log; its last line
# starting with "figures:" goes to the summary; exit 77 means skipped.
step() {
  local name=$1 fn=$2 start=$SECONDS rc figures
  say "== $name"
  "$fn" >"$work/step.out" 2>&1
  rc=$?
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
  [ -f "$nccl_include/nccl.h" ] && extra="$extra -isystem $nccl_include" && echo "nccl.h: $nccl_include"
  local d
  for d in $("$PYTHON" -c 'import glob, os, nvidia; print(" ".join(glob.glob(os.path.join(list(nvidia.__path__)[0], "*", "include"))))' 2>/dev/null); do
    extra="$extra -idirafter $d"
  done
  if [ "$has_gpu" = 1 ] && command -v nvcc >/dev/null; then
    local cap
    cap=$("$PYTHON" -c 'import torch; print("%d.%d" % torch.cuda.get_device_capability(0))' 2>/dev/null)
    cuda_args=(-DCMAKE_CUDA_COMPILER="$(command -v nvcc)")
    [ -n "$cap" ] && cuda_args+=(-DTORCH_CUDA_ARCH_LIST="$cap" -DCMAKE_CUDA_ARCHITECTURES="${cap/./}")
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
  cmake --build "$build" -j "$JOBS" || return 1
  echo "figures: $(ls "$build"/lockstep "$build"/lockstep-run "$build"/tests/lockstep_tests | wc -l) binaries, $JOBS jobs"
}
step "build" compile || { say "build failed: stop"; exit 1; }

# ------------------------------------------------------------ tests and checks
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} USE_LIBUV=0
run=$build/lockstep-run
bin=$build/lockstep
unit_suite() {
  # unit.cuda runs in the next step, on its own
  timeout -k 5 240 ctest --test-dir "$build" -L unit -LE cuda -j "$JOBS" --output-on-failure --timeout 120 \
    >"$work/ctest_unit.txt" 2>&1
  local rc=$?
  tail -n 25 "$work/ctest_unit.txt"
  echo "figures: $(grep -E '% tests passed' "$work/ctest_unit.txt")"
  return $rc
}
step "unit suite (ctest -L unit -LE cuda)" unit_suite
cuda_tests() {
  [ "$has_gpu" = 1 ] || { echo "figures: no GPU"; return 77; }
  timeout -k 5 180 "$build/tests/lockstep_tests" "[.cuda]" || return 1
  echo "figures: the [.cuda] cases passed"
}
step "CUDA tests ([.cuda])" cuda_tests
# comm_check FILE CMD...: one communication self-check; the summary line of
# its table becomes the step's figures.
comm_check() {
  [ "$has_gpu" = 1 ] || { echo "figures: no GPU"; return 77; }
  local file=$work/$1
  shift
  timeout -k 5 120 "$@" >"$file" 2>&1
  local rc=$?
  cat "$file"
  echo "figures: $(grep -o 'comm check (.*' "$file" | head -n 1)"
  return $rc
}
comm_nccl() { comm_check comm_nccl.txt "$bin" check --comm --backend nccl; }
comm_gloo_cuda() {
  comm_check comm_gloo.txt "$run" --nproc-per-node 2 --master-port 0 "$bin" check --comm --backend gloo --device cuda
}
step "check --comm --backend nccl (world 1)" comm_nccl
step "check --comm --backend gloo --device cuda (2 ranks)" comm_gloo_cuda
# train NAME NPROC SETTINGS...: digits with per-step checks, then the
# checkpoint loaded and evaluated in Python (docs/models.md's own code).
train_gpu() {
  local name=$1 nproc=$2
  shift 2
  timeout -k 5 150 "$run" --nproc-per-node "$nproc" --master-port 0 "$bin" train --config "$root/configs/digits.yaml" \
    --set run.dir="$work/runs" --set run.name="$name" --set train.max_steps=100 --set check.every=1 \
    "$@" >"$work/train_$name.txt" 2>&1 || { cat "$work/train_$name.txt"; return 1; }
  tail -n 5 "$work/train_$name.txt"
  local line acc got
  line=$(grep -o 'validation accuracy [0-9.]*, loss [0-9.]*' "$work/train_$name.txt")
  acc=$(echo "$line" | sed 's/.*accuracy \([0-9.]*\),.*/\1/')
  got=$("$PYTHON" "$root/tests/python/rebuild.py" "$root/docs/models.md" "$root/data/digits.csv.gz" mlp \
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
quick=${LOCKSTEP_GPU_QUICK:-0}
stand_in=""  # "CPU stand-in: " before the figures of a step that ran on the CPU
train_gloo_cuda() {
  if [ "$has_gpu" != 1 ]; then
    [ "$quick" = 1 ] || { echo "figures: no GPU"; return 77; }
    echo "no GPU: the CPU stand-in of this step (a rehearsal)"
    stand_in="CPU stand-in: "
    train_gpu gloo2 2 --set dist.backend=gloo --set train.device=cpu
    local rc=$?
    stand_in=""
    return $rc
  fi
  train_gpu gloo2 2 --set dist.backend=gloo --set train.device=cuda
}
step "train digits on the GPU (nccl, world 1)" train_nccl
step "train digits on the GPU (gloo over CUDA, 2 ranks)" train_gloo_cuda
gpt() {
  [ -f "$root/configs/gpt-text.yaml" ] || { echo "figures: no configs/gpt-text.yaml yet (issue 25)"; return 77; }
  "$bin" train --config "$root/configs/gpt-text.yaml" --set dist.backend=nccl --set run.dir="$work/runs" \
    --set train.max_steps=50 || return 1
  echo "figures: 50 steps"
}
step "train the GPT config on the GPU" gpt
rounds=1
deadline=${LOCKSTEP_GPU_DEADLINE_S:-420}  # seconds into the run after which benchmarks are skipped
bench_ddp() {  # bench_ddp LABEL NPROC BACKEND TORCH_BACKEND DEVICE [MODELS]
  [ "$has_gpu" = 1 ] || [ "$5" = cpu ] || { echo "figures: no GPU"; return 77; }
  [ "$SECONDS" -lt "$deadline" ] || { echo "figures: skipped, past ${deadline} s (the device's time)"; return 77; }
  ERRLOG=$work/bench_ddp_$1.err timeout -k 5 150 env BUILD=$build PYTHON=$PYTHON NPROC=$2 BACKEND=$3 TORCH_BACKEND=$4 DEVICE=$5 ROUNDS=$rounds \
    MODELS=${6:-small,xl} MODES=local,ddp STEPS=30 WARMUP=10 bash "$root/scripts/bench_ddp.sh" \
    >"$work/bench_ddp_$1.txt" 2>&1
  local rc=$?
  cat "$work/bench_ddp_$1.txt" "$work/bench_ddp_$1.err" 2>/dev/null
  echo "figures: ${stand_in}$(awk '$2 == "ddp" {printf "%s %s/PyTorch %s; ", $1, "lockstep", $7}' "$work/bench_ddp_$1.txt")"
  return $rc
}
bench_nccl() { bench_ddp nccl 1 nccl nccl cuda; }
bench_gloo_cuda() {
  if [ "$has_gpu" != 1 ] && [ "$quick" = 1 ]; then
    echo "no GPU: the CPU stand-in of this step (a rehearsal)"
    stand_in="CPU stand-in: "
    bench_ddp gloo_cpu 2 gloo gloo cpu small,large
    local rc=$?
    stand_in=""
    return $rc
  fi
  bench_ddp gloo_cuda 2 gloo gloo cuda
}
step "bench ddp on the GPU beside PyTorch's DDP (nccl, world 1)" bench_nccl
step "bench ddp on the GPU beside PyTorch's DDP (gloo over CUDA, 2 ranks)" bench_gloo_cuda
bench_allreduce() {
  [ "$has_gpu" = 1 ] || { echo "figures: no GPU"; return 77; }
  [ "$SECONDS" -lt "$deadline" ] || { echo "figures: skipped, past ${deadline} s (the device's time)"; return 77; }
  timeout -k 5 90 "$bin" bench allreduce --backends nccl --max-bytes $((256 << 20)) >"$work/bench_allreduce.txt" 2>&1
  local rc=$?
  cat "$work/bench_allreduce.txt"
  echo "figures: world size 1 (one GPU): no ring to measure; see docs/gpu.md"
  return $rc
}
step "bench allreduce --backends nccl" bench_allreduce

say "gpu_check: $failed step(s) failed; summary in $summary"
cat "$summary" >&2
exit "$failed"
