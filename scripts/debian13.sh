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

source "$here/scripts/lib/debian_mirror.sh"
source "$here/scripts/lib/chroot.sh"

packages=$(LOCKSTEP_DEBIAN_RELEASE=13 bash "$here/scripts/setup.sh" --packages | sort | tr '\n' ' ')
want="debootstrap minbase trixie; packages: $packages"

if [ ! -f "$root/.lockstep-root" ] || [ "$(cat "$root/.lockstep-root")" != "$want" ]; then
  echo "debian13: building a minimal Debian 13 root in $root (debootstrap, then ~240 packages)"
  build_root "$root" "$packages" "$want"
fi
host_tools

copy_checkout "$here" "$root" "$src"
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
  LANG=C.UTF-8 CI="${CI:-}" PIP_CERT=/etc/ssl/certs/host-ca-certificates.crt \
  PIP_DEFAULT_TIMEOUT="${PIP_DEFAULT_TIMEOUT:-180}" /bin/bash -c "cd $src && $cmd"
rc=$?
set -e
exit $rc
