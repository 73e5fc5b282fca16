#!/usr/bin/env bash
# Fuzzes the state-dict reader with libFuzzer under AddressSanitizer and
# UndefinedBehaviorSanitizer, seeded with the corpus, for a fixed number of
# runs from a fixed seed (so CI's verdict is repeatable). Needs clang with
# its runtime (clang and libclang-rt-*-dev, installed by
# scripts/setup.sh on Debian 12 and 13); exits 77 (skipped) without them.
# Usage: run.sh [RUNS]   (default 200000, about 30 s here)
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
runs=${1:-200000}
cxx=$(command -v clang++ || true)
if [ -z "$cxx" ] || ! echo 'int main(){}' | "$cxx" -x c++ -fsanitize=fuzzer-no-link,address - -o /dev/null 2>/dev/null; then
  echo "skipped: no clang++ with the sanitizer/libFuzzer runtime here"
  exit 77
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
/usr/bin/python3 "$root/tests/fuzz/make_corpus.py" "$work/seeds" || { echo "0 passed, 1 failed"; exit 1; }
flags=(-std=c++17 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize=vptr
       -fno-sanitize-recover=undefined -D_GLIBCXX_USE_CXX11_ABI=1
       -I"$root/include" -I"$root/src/io" -I/usr/include/torch/csrc/api/include)
if ! "$cxx" "${flags[@]}" "$root/tests/fuzz/fuzz_state_dict.cpp" "$root/src/io/torch_pickle.cpp" "$root/src/io/pickle_machine.cpp" \
  "$root/src/io/zip_records.cpp" "$root/src/util/error.cpp" \
  -ltorch -ltorch_cpu -lc10 -o "$work/fuzz" 2>"$work/build.log"; then
  tail -20 "$work/build.log"
  echo "0 passed, 1 failed"
  exit 1
fi
mkdir -p "$work/corpus"
ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=1 \
  "$work/fuzz" -seed=1 -runs="$runs" -rss_limit_mb=2048 -timeout=20 -max_len=65536 \
  "$work/corpus" "$work/seeds" >"$work/fuzz.log" 2>&1
rc=$?
tail -5 "$work/fuzz.log"
if [ $rc -eq 0 ]; then
  echo "1 passed, 0 failed"
else
  grep -E "ERROR|SUMMARY|runtime error" "$work/fuzz.log" | head -10
  echo "0 passed, 1 failed"
  exit 1
fi
