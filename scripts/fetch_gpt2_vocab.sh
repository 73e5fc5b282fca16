#!/usr/bin/env bash
# GPT-2's BPE ranks for `lockstep tokenize` and `data.tokenizer: gpt2`
# (docs/models.md): whisper/assets/gpt2.tiktoken from the PyPI package
# openai-whisper 20250625 (MIT licence), the file tiktoken itself checks for
# "gpt2"/"r50k_base" (SHA-256 306cd27f...), downloaded with pip (no
# dependencies installed), checked, and copied with its licence into
# BUILD_DIR/share/lockstep/gpt2, where lockstep finds it. Never fetched at
# run time. Without pip or PyPI it says so and exits 0: tokenize then needs
# --vocab, and its tests skip saying why.
#   scripts/fetch_gpt2_vocab.sh [BUILD_DIR]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
dest="$build/share/lockstep/gpt2"
sha=306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930
version=20250625
check() { echo "$sha  $1" | sha256sum --quiet -c - 2>/dev/null; }
if [ -f "$dest/gpt2.tiktoken" ] && check "$dest/gpt2.tiktoken"; then exit 0; fi
cache=${LOCKSTEP_PYPI_CACHE:-$build/pypi}
sdist="$cache/openai_whisper-$version.tar.gz"
if [ ! -f "$sdist" ]; then
  mkdir -p "$cache"
  if ! /usr/bin/python3 -m pip download --no-deps --no-binary :all: -q -d "$cache" \
      "openai-whisper==$version" >"$cache/pip.log" 2>&1; then
    echo "setup: pip could not download openai-whisper==$version from PyPI ($(tail -1 "$cache/pip.log")):" \
         "GPT-2's ranks not installed (lockstep tokenize needs --vocab; its tests skip)" >&2
    exit 0
  fi
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
tar -xzf "$sdist" -C "$tmp" "openai_whisper-$version/whisper/assets/gpt2.tiktoken" \
  "openai_whisper-$version/LICENSE"
got="$tmp/openai_whisper-$version/whisper/assets/gpt2.tiktoken"
if ! check "$got"; then
  echo "setup: openai-whisper's gpt2.tiktoken is not GPT-2's (SHA-256 differs): not installed" >&2
  exit 1
fi
mkdir -p "$dest"
cp "$got" "$dest/gpt2.tiktoken"
cp "$tmp/openai_whisper-$version/LICENSE" "$dest/LICENSE.openai-whisper"
echo "setup: GPT-2's ranks in $dest/gpt2.tiktoken (PyPI openai-whisper $version, MIT)"
