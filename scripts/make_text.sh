#!/usr/bin/env bash
# The demo's text (configs/gpt-text.yaml): the King James Version of the
# Bible, printed by Debian's bible-kjv from the text its bible-kjv-text
# package ships (public domain: the translation of 1611; the packaging is
# GPL-2+, docs/models.md). Written to data/kjv.txt (git-ignored), 4.3 MB,
# and checked against its SHA-256: never downloaded at run time.
#   scripts/make_text.sh [OUT]      (default data/kjv.txt)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-data/kjv.txt}
# One line per known build of the text (80 columns, the whole book).
known=(
  ba7c84a755b5ecc052222311dc2d785cd6cf9c0875ca26fc31de1138501496d5  # bible-kjv 4.38 (Debian 12) and 4.39 (Debian 13)
)
if ! command -v bible >/dev/null; then
  echo "make_text: the 'bible' program is missing: install bible-kjv (scripts/setup.sh does)" >&2
  exit 2
fi
ok() { local h; h=$(sha256sum "$1" | cut -d' ' -f1); for k in "${known[@]}"; do [ "$h" = "$k" ] && return 0; done; return 1; }
[ -f "$out" ] && ok "$out" && exit 0
mkdir -p "$(dirname "$out")"
COLUMNS=80 bible -l80 "Gen1:1-Rev22:21" >"$out.tmp"
if ! ok "$out.tmp"; then
  echo "make_text: $out.tmp has SHA-256 $(sha256sum "$out.tmp" | cut -d' ' -f1), not a known" \
       "build of the text (${known[*]}): another bible-kjv version? Check it and add its hash here" >&2
  exit 2
fi
mv "$out.tmp" "$out"
echo "make_text: wrote $out ($(stat -c %s "$out") bytes, SHA-256 verified)"
