#!/usr/bin/env bash
# Rehearses the GPU kit on this CPU machine (docs/gpu.md): a fresh Debian 13
# root with a Python torch (python3-torch 2.6), the toolchain (CMake, ninja,
# g++) and LibTorch's CMake files (libtorch-dev: python3-torch ships none),
# but none of lockstep's -dev dependencies from the registry, runs
# scripts/gpu_check.sh there with only the carried files (gpu-deps/,
# scripts/gpu_fetch_deps.sh) to satisfy them. Not part of CI.
#
#   scripts/gpu_rehearse.sh [OUT]        default OUT: build-gpu-rehearsal/
#   FROM_SOURCE=1 scripts/gpu_rehearse.sh   also rehearse the source fallback
#   LOCKSTEP_GPU_ONLY=REGEX scripts/gpu_rehearse.sh   only those steps (after the build)
# Needs root (debootstrap, chroot, mounts). The root is cached in
# LOCKSTEP_GPU_REHEARSAL_ROOT (default /var/cache/lockstep/gpu-rehearsal).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
out=$(realpath -m "${1:-$here/build-gpu-rehearsal}")
cache=${LOCKSTEP_GPU_REHEARSAL_ROOT:-/var/cache/lockstep/gpu-rehearsal}
root=$cache/root
src=/home/lockstep/lockstep
die() { echo "gpu_rehearse: $*" >&2; exit 2; }
[ "$(id -u)" -eq 0 ] || die "needs root (debootstrap, chroot and bind mounts)"
source "$here/scripts/lib/debian_mirror.sh"
source "$here/scripts/lib/chroot.sh"

# What a bare GPU machine has: a Python torch and a toolchain. Tools the
# kit itself uses: binutils (ar), xz-utils and bzip2 (source tarballs).
packages="python3 python3-torch libtorch-dev g++ cmake ninja-build make binutils xz-utils bzip2 procps"
if [ ! -f "$root/.lockstep-root" ] || [ "$(cat "$root/.lockstep-root")" != "$packages" ]; then
  echo "gpu_rehearse: building a Debian 13 root in $root (debootstrap, python3-torch, libtorch-dev, toolchain)"
  build_root "$root" "$packages" "$packages"
fi
[ -f "$here/gpu-deps/SHA256SUMS" ] || bash "$here/scripts/gpu_fetch_deps.sh"
copy_checkout "$here" "$root" "$src"
rsync -a --delete "$here/gpu-deps/" "$root$src/gpu-deps/"
enter_mounts "$root"

# Which of lockstep's -dev dependencies the toolchain pulled in anyway (the
# kit points CMake at the carried ones first).
present=$(chroot "$root" dpkg-query -W -f='${Package} ${Status}\n' libyaml-cpp-dev libspdlog-dev \
  libfmt-dev libcxxopts-dev catch2 libxxhash-dev libssl-dev zlib1g-dev libgloo-dev 2>/dev/null |
  awk '/install ok installed/ {print $1}' | tr '\n' ' ' || true)
echo "gpu_rehearse: lockstep -dev packages in the root: ${present:-none}"

rm -rf "$root/home/lockstep/gpu-out"
rc=0
# No deadline: 2 cores build for ~10 minutes (the device's 16 in ~2).
inner="cd $src && PYTHON=python3 LOCKSTEP_TORCH_PREFIX=/usr/lib/x86_64-linux-gnu/cmake LOCKSTEP_GPU_QUICK=1"
inner="$inner LOCKSTEP_GPU_DEADLINE_S=${LOCKSTEP_GPU_DEADLINE_S:-100000} LOCKSTEP_GPU_LIMIT_S=200000"
inner="$inner LOCKSTEP_GPU_FROM_SOURCE=${FROM_SOURCE:-0} LOCKSTEP_GPU_ONLY='${LOCKSTEP_GPU_ONLY:-}'"
inner="$inner bash scripts/gpu_check.sh /home/lockstep/gpu-out gpu-deps"
chroot "$root" /usr/bin/env -i HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  LANG=C.UTF-8 /bin/bash -c "$inner" || rc=$?
rm -rf "$out" && mkdir -p "$out"
cp -r "$root/home/lockstep/gpu-out/." "$out/"
echo "lockstep -dev packages present in the root: ${present:-none}" >>"$out/summary.md"
echo "gpu_rehearse: gpu_check.sh exit $rc; $out/summary.md, $out/gpu_check.log"
exit $rc
