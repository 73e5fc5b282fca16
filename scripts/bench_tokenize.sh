#!/usr/bin/env bash
# lockstep tokenize beside tiktoken, alternated, on this machine: GPT-2's
# ranks (the installed gpt2.tiktoken) or Llama 3's tokenizer.model
# (scripts/fetch_llama3_tokenizer.sh's test data), on the parity corpus of
# tests/multiproc/tokenize.sh less its invalid UTF-8 (the KJV and 5 MB of
# Debian's documentation, valid UTF-8: tiktoken's own path).
# tiktoken's figure is its encoding alone (tests/python/tiktoken_reference.py,
# encode_ordinary, one thread); lockstep's is its own
# report (encoding and writing, after reading the vocabulary), on 1 and 2
# threads. Prints the median of ROUNDS with the CPU model.
#   scripts/bench_tokenize.sh [gpt2|llama3]      (env: ROUNDS=3 BUILD=build-pip PYTHON=...)
set -euo pipefail
cd "$(dirname "$0")/.."
which=${1:-gpt2}
ROUNDS=${ROUNDS:-3}
pip_python=${LOCKSTEP_PIP_ROOT:-/var/cache/lockstep}/torch-2.15.0/bin/python
if [ -z "${PYTHON:-}" ] && [ -x "$pip_python" ] && [ -x build-pip/lockstep ]; then
  PYTHON=$pip_python BUILD=${BUILD:-build-pip}
fi
PYTHON=${PYTHON:-build/venv-tools/bin/python}
BUILD=${BUILD:-build}
case "$which" in
  gpt2) vocab="$BUILD/share/lockstep/gpt2/gpt2.tiktoken"; format=nanogpt ;;
  llama3) vocab="$BUILD/test-data/llama3/tokenizer.model"; format=llmc ;;
  *) echo "bench_tokenize: '$which' is not gpt2 or llama3" >&2; exit 2 ;;
esac
[ -f "$vocab" ] || { echo "bench_tokenize: $vocab is missing (scripts/setup.sh fetches it)" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
{ cat /usr/share/common-licenses/* /usr/share/doc/*/copyright 2>/dev/null || true; } | head -c 5000000 >"$work/debian.txt" || true
cat data/kjv.txt "$work/debian.txt" | iconv -f UTF-8 -t UTF-8 -c >"$work/corpus.bin"
bytes=$(stat -c %s "$work/corpus.bin")
rate() { grep -o "[0-9.]* MB/s on" "$1" | awk '{print $1}'; }
for r in $(seq 1 "$ROUNDS"); do
  read -r _ _ s < <("$PYTHON" tests/python/tiktoken_reference.py "$vocab" "$work/corpus.bin" "$work/ref.bin")
  awk -v b="$bytes" -v s="$s" 'BEGIN{printf "%.2f\n", b / 1e6 / s}' >>"$work/tiktoken"
  for t in 1 2; do
    rm -rf "$work/out"
    "$BUILD/lockstep" tokenize "$work/corpus.bin" --vocab "$vocab" --format "$format" --out "$work/out" \
      --val-fraction 0 --threads "$t" 2>"$work/log"
    rate "$work/log" >>"$work/lockstep$t"
  done
done
median() { sort -g "$1" | awk '{v[NR]=$1} END{print v[int((NR+1)/2)]}'; }
ref=$(median "$work/tiktoken")
echo "$which's tokenizer on $bytes bytes, $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores, median of $ROUNDS alternated rounds:"
echo "| | MB/s | vs tiktoken |"
echo "| --- | ---: | ---: |"
echo "| tiktoken $("$PYTHON" -c 'import tiktoken; print(tiktoken.__version__)'), 1 thread | $ref | 1.0x |"
for t in 1 2; do
  m=$(median "$work/lockstep$t")
  echo "| lockstep, $t thread(s) | $m | $(awk -v a="$m" -v b="$ref" 'BEGIN{printf "%.2fx", a / b}') |"
done
