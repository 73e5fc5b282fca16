#!/usr/bin/env bash
# Fetches, on this machine (Debian, with apt), everything scripts/gpu_check.sh
# needs besides a Python torch, CMake, ninja and a C++ compiler, into one
# folder that travels to a machine without package registries (docs/gpu.md):
#   - Debian 12 binary packages (.deb) of lockstep's dependencies: headers,
#     CMake files and shared libraries (glibc 2.36, GCC 12's libstdc++), and
#     Debian 13's gloo headers (the LibTorch 2.x side of ProcessGroupGloo);
#   - Debian 12 source packages of the compiled ones (yaml-cpp, fmt, spdlog,
#     xxhash, zlib, OpenSSL), which gpu_check.sh builds when the machine's C
#     library or the torch's C++ ABI does not fit the binaries.
# The mirror is the one this machine's apt already uses (read at run time).
#
#   scripts/gpu_fetch_deps.sh [DIR]     default DIR: gpu-deps (git-ignored)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
out=$(realpath -m "${1:-$here/gpu-deps}")
source "$here/scripts/lib/debian_mirror.sh"

die() { echo "gpu_fetch_deps: $*" >&2; exit 2; }
command -v apt-get >/dev/null || die "needs apt-get (a Debian machine)"
mirror=$(debian_mirror)
[ -n "$mirror" ] || die "no Debian mirror found in /etc/apt/sources.list{,.d}"

# Binary packages: name per release. Headers-only ones first.
BOOKWORM_DEBS=(
  libcxxopts-dev catch2 libxxhash-dev libxxhash0
  libspdlog-dev libspdlog1.10 libfmt-dev libfmt9
  libyaml-cpp-dev libyaml-cpp0.7
  libssl-dev libssl3 zlib1g-dev zlib1g
)
TRIXIE_DEBS=(libgloo-dev)
SOURCES=(yaml-cpp fmtlib spdlog xxhash zlib openssl)

# A private apt state: bookworm and trixie, binaries and sources, without
# touching this machine's apt configuration.
state=$(mktemp -d)
trap 'rm -rf "$state"' EXIT
mkdir -p "$state/lists/partial" "$state/cache/archives/partial" "$state/parts"
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
[ -f "$keyring" ] || die "no $keyring (package debian-archive-keyring)"
for suite in bookworm trixie; do
  echo "deb [signed-by=$keyring] $mirror $suite main"
  echo "deb-src [signed-by=$keyring] $mirror $suite main"
done >"$state/sources.list"
apt_private=(-o "Dir::Etc::SourceList=$state/sources.list" -o "Dir::Etc::SourceParts=$state/parts"
             -o "Dir::State::Lists=$state/lists" -o "Dir::Cache=$state/cache"
             -o "Dir::State::status=/var/lib/dpkg/status" -o "APT::Get::List-Cleanup=0"
             -o "APT::Sandbox::User=root")
echo "gpu_fetch_deps: package lists of bookworm and trixie from $mirror" >&2
apt-get "${apt_private[@]}" update -qq

rm -rf "$out.new"
mkdir -p "$out.new/debs" "$out.new/sources"
(
  cd "$out.new/debs"
  pkgs=()
  for p in "${BOOKWORM_DEBS[@]}"; do pkgs+=("$p/bookworm"); done
  for p in "${TRIXIE_DEBS[@]}"; do pkgs+=("$p/trixie"); done
  apt-get "${apt_private[@]}" download -qq "${pkgs[@]}"
)
(
  cd "$out.new/sources"
  for p in "${SOURCES[@]}"; do
    apt-get "${apt_private[@]}" source --download-only -qq "$p/bookworm"
  done
)
(
  cd "$out.new"
  find debs sources -type f | sort | xargs sha256sum >SHA256SUMS
  {
    echo "lockstep's carried dependencies for scripts/gpu_check.sh (docs/gpu.md)."
    echo "Fetched $(date -u +%Y-%m-%dT%H:%MZ) by scripts/gpu_fetch_deps.sh; verify: sha256sum -c SHA256SUMS"
  } >README
)
rm -rf "$out"
mv "$out.new" "$out"
echo "gpu_fetch_deps: $(find "$out/debs" -name '*.deb' | wc -l) packages, $(find "$out/sources" -name '*.dsc' | wc -l) source packages, $(du -sh "$out" | cut -f1) in $out"
