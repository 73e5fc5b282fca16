#!/usr/bin/env bash
# Runs a command in a fresh Debian 13 ("trixie") root, as a new user of
# Debian 13 would: the checkout is copied to /home/lockstep/lockstep in the
# root and the command (default: scripts/test.sh) runs there, so the whole
# suite builds against Debian 13's LibTorch 2.6, Catch2 v3, spdlog 1.15 and
# runs beside python3-torch 2.6.
#
#   scripts/debian13.sh                       scripts/test.sh in the root
#   scripts/debian13.sh scripts/bench_ddp.sh  any command, from the copy
#   scripts/debian13.sh --shell               an interactive shell there
#
# The root is cached outside the checkout (LOCKSTEP_DEBIAN13_ROOT, default
# /var/cache/lockstep/debian13) and rebuilt when missing or when the package
# list (scripts/setup.sh --packages for release 13) changes. The copy of the
# checkout and its build/ stay in the root between runs, so a second run
# rebuilds only what changed. Needs root (debootstrap, chroot, mounts).
# The mirror is read from this machine's apt sources, never written down.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cache=${LOCKSTEP_DEBIAN13_ROOT:-/var/cache/lockstep/debian13}
root=$cache/root
src=/home/lockstep/lockstep

die() { echo "debian13: $*" >&2; exit 2; }
[ "$(id -u)" -eq 0 ] || die "needs root (debootstrap, chroot and bind mounts)"

# The Debian mirror this machine's apt uses (deb822 .sources or one-line .list).
debian_mirror() {
  {
    local f
    for f in /etc/apt/sources.list.d/*.sources; do
      [ -e "$f" ] || continue
      awk '/^URIs:/ {u=$2} /^Suites:/ {s=$2}
           /^$/ {if (u && s !~ /security/ && u ~ /debian\/?$/) print u; u=""; s=""}
           END {if (u && s !~ /security/ && u ~ /debian\/?$/) print u}' "$f"
    done
    cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
      awk '$1 == "deb" && $2 ~ /debian\/?$/ && $3 !~ /security/ {print $2}'
  } | head -n1 || true
}

host_tools() {
  local need=()
  command -v debootstrap >/dev/null || need+=(debootstrap)
  command -v rsync >/dev/null || need+=(rsync)
  if [ ${#need[@]} -gt 0 ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}"
  fi
}

packages=$(LOCKSTEP_DEBIAN_RELEASE=13 bash "$here/scripts/setup.sh" --packages | sort | tr '\n' ' ')
want="debootstrap minbase trixie; packages: $packages"

mounted=()
cleanup() {  # everything mounted under the root, deepest first (tests add their own)
  local m
  for m in "${mounted[@]}"; do
    awk -v p="$m" '$2 == p || index($2, p "/") == 1 {print $2}' /proc/self/mounts
  done | sort -u -r | while read -r m; do umount -l "$m" 2>/dev/null || true; done
  mounted=()
}
trap cleanup EXIT
bind() {  # bind SRC DEST-inside-ROOT
  mkdir -p "$2"
  mount --bind "$1" "$2"
  mounted+=("$2")
}
enter_mounts() {  # enter_mounts ROOTDIR
  # The root bound onto itself is a mount point, as / is on a real machine:
  # `ip netns add` (the two-host test) remounts / and fails otherwise.
  bind "$1" "$1"
  bind /proc "$1/proc"
  bind /sys "$1/sys"
  bind /dev "$1/dev"
  bind /dev/pts "$1/dev/pts"
  mkdir -p "$1/dev/shm"
  mount -t tmpfs -o size=4g tmpfs "$1/dev/shm" && mounted+=("$1/dev/shm")
  cp /etc/resolv.conf "$1/etc/resolv.conf" 2>/dev/null || true
  # CUDA's headers (build.nccl_syntax compiles the NCCL source against them).
  if [ -d /usr/local/cuda/include ]; then
    bind "$(readlink -f /usr/local/cuda)" "$1/usr/local/cuda"
    mount -o remount,bind,ro "$1/usr/local/cuda" 2>/dev/null || true
  fi
}

build_root() {
  host_tools
  local mirror new=$cache/root.new
  mirror=$(debian_mirror)
  [ -n "$mirror" ] || die "no Debian mirror found in /etc/apt/sources.list{,.d}"
  echo "debian13: building a minimal Debian 13 root in $root (debootstrap, then ~240 packages)"
  rm -rf "$new"
  mkdir -p "$cache"
  debootstrap --variant=minbase trixie "$new" "$mirror" >"$cache/debootstrap.log" 2>&1 ||
    { tail -n 20 "$cache/debootstrap.log" >&2; die "debootstrap failed (log: $cache/debootstrap.log)"; }
  enter_mounts "$new"
  # shellcheck disable=SC2086
  chroot "$new" /bin/bash -c "apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -qq --no-install-recommends $packages >/var/log/lockstep-install.log 2>&1 ||
    { tail -n 30 /var/log/lockstep-install.log; exit 1; }"
  cleanup
  echo "$want" >"$new/.lockstep-root"
  rm -rf "$root"
  mv "$new" "$root"
}

if [ ! -f "$root/.lockstep-root" ] || [ "$(cat "$root/.lockstep-root")" != "$want" ]; then
  build_root
fi
host_tools

# The checkout as a new user would have it: the tracked and untracked files,
# without this machine's build folders. Compared by content, and a file that
# changed gets a new mtime (-t is left out on purpose): several checkouts (a
# CI clone, a working tree) share the root's copy, and their mtimes would
# make ninja keep objects built from another checkout's older headers.
mkdir -p "$root$src"
rsync -rlpD --checksum --delete --exclude='/build/' --exclude='/build-*/' --exclude='/runs/' \
  "$here/" "$root$src/"
enter_mounts "$root"

if [ "${1:-}" = --shell ]; then
  chroot "$root" /bin/bash -c "cd $src && exec bash -l"
  exit
fi
[ $# -gt 0 ] || set -- scripts/test.sh
# Quote each argument for the inner shell.
cmd=$(printf '%q ' "$@")
set +e
chroot "$root" /usr/bin/env -i HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  LANG=C.UTF-8 CI="${CI:-}" /bin/bash -c "cd $src && $cmd"
rc=$?
set -e
exit $rc
