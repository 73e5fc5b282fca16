# Sourced by scripts that fetch from Debian (debian13.sh, gpu_fetch_deps.sh):
# the mirror this machine's apt already uses, read at run time so that no
# host name is written into the repository.
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
