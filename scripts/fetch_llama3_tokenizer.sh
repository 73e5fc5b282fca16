#!/usr/bin/env bash
# Llama 3's tokenizer.model (a tiktoken rank file, 128,000 ranks) for the
# tests that check lockstep's Llama 3 tokenizer against tiktoken
# (tests/multiproc/tokenize_llama3.sh): llama_models/llama3/tokenizer.model
# from the PyPI package llama-models 0.3.0 (Meta; the Llama 3 Community
# License), downloaded with pip (no dependencies installed), checked by its
# SHA-256 and copied into BUILD_DIR/test-data/llama3. Test data only: never
# installed beside the programs, never fetched at run time. Without pip or
# PyPI it says so and exits 0: those tests then skip saying why.
#   scripts/fetch_llama3_tokenizer.sh [BUILD_DIR]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
dest="$build/test-data/llama3"
sha=82e9d31979e92ab929cd544440f129d9ecd797b69e327f80f17e1c50d5551b55
version=0.3.0
check() { echo "$sha  $1" | sha256sum --quiet -c - 2>/dev/null; }
if [ -f "$dest/tokenizer.model" ] && check "$dest/tokenizer.model"; then exit 0; fi
cache=${LOCKSTEP_PYPI_CACHE:-$build/pypi}
wheel="$cache/llama_models-$version-py3-none-any.whl"
if [ ! -f "$wheel" ]; then
  mkdir -p "$cache"
  if ! /usr/bin/python3 -m pip download --no-deps --only-binary :all: -q -d "$cache" \
      "llama-models==$version" >"$cache/pip-llama.log" 2>&1; then
    echo "setup: pip could not download llama-models==$version from PyPI ($(tail -1 "$cache/pip-llama.log")):" \
         "Llama 3's tokenizer.model not fetched (its tests skip)" >&2
    exit 0
  fi
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
/usr/bin/python3 - "$wheel" "$tmp" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    z.extract("llama_models/llama3/tokenizer.model", sys.argv[2])
PY
got="$tmp/llama_models/llama3/tokenizer.model"
if ! check "$got"; then
  echo "setup: llama-models' tokenizer.model is not Llama 3's (SHA-256 differs): not fetched" >&2
  exit 1
fi
mkdir -p "$dest"
cp "$got" "$dest/tokenizer.model"
echo "setup: Llama 3's tokenizer.model in $dest (PyPI llama-models $version, test data)"
