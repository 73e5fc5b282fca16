# Sourced by the scripts that run the suite in a Debian root of their own
# (debian13.sh, gpu_rehearse.sh): bind mounts that are undone on exit, and a
# fresh debootstrap root with a package list.

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
  # The host's certificate bundle, for pip inside (PIP_CERT: a machine whose
  # registry is reached through a proxy with its own CA trusts it here too).
  mkdir -p "$1/etc/ssl/certs"
  cp "${PIP_CERT:-/etc/ssl/certs/ca-certificates.crt}" "$1/etc/ssl/certs/host-ca-certificates.crt" 2>/dev/null || true
  # CUDA's headers (build.nccl_syntax compiles the NCCL source against them).
  if [ -d /usr/local/cuda/include ]; then
    bind "$(readlink -f /usr/local/cuda)" "$1/usr/local/cuda"
    mount -o remount,bind,ro "$1/usr/local/cuda" 2>/dev/null || true
  fi
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

# build_root ROOT "PACKAGES" STAMP: debootstrap minbase trixie into ROOT (via
# ROOT.new), install PACKAGES, write STAMP into ROOT/.lockstep-root.
build_root() {
  local root=$1 packages=$2 stamp=$3 mirror new=$1.new cache
  cache=$(dirname "$1")
  host_tools
  mirror=$(debian_mirror)
  [ -n "$mirror" ] || die "no Debian mirror found in /etc/apt/sources.list{,.d}"
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
  echo "$stamp" >"$new/.lockstep-root"
  rm -rf "$root"
  mv "$new" "$root"
}

# copy_checkout HERE ROOT SRC: the checkout as a new user would have it (the
# tracked and untracked files, without build folders), into ROOT/SRC.
# Compared by content; a file that changed gets a new mtime (-t is left out
# on purpose: several checkouts share the root's copy, and their mtimes
# would make ninja keep objects built from another checkout's headers).
copy_checkout() {
  mkdir -p "$2$3"
  rsync -rlpD --checksum --delete --exclude='/build/' --exclude='/build-*/' --exclude='/runs/' \
    --exclude='/gpu-deps/' "$1/" "$2$3/"
}
