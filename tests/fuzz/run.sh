#!/usr/bin/env bash
# Fuzzes the readers of untrusted bytes with libFuzzer under AddressSanitizer
# and UndefinedBehaviorSanitizer, each seeded with its corpus, for a fixed
# number of runs from a fixed seed (so CI's verdict is repeatable): the
# state-dict reader (fuzz_state_dict.cpp), then each target of
# fuzz_readers.cpp (vocabularies and tokenizer.json, safetensors, the shard
# index, token files, progress records). Needs clang with its runtime
# (clang and libclang-rt-*-dev, installed by scripts/setup.sh on Debian 12
# and 13); exits 77 (skipped) without them. The reader targets link the
# build's own libraries for what they do not fuzz (BUILD_DIR, default
# build/).
# Usage: run.sh [RUNS] [BUILD_DIR] [READER_RUNS]
#   RUNS: the state-dict target's (default 200000, about 30 s here);
#   READER_RUNS: each reader target's (default 30000).
#   LOCKSTEP_FUZZ_SECONDS=N: each reader target for N seconds instead (a
#   longer hunt than the suite's; the run count is then open).
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
passed=0 failed=0
verdict() {  # verdict NAME RC LOG
  if [ "$2" -eq 0 ]; then
    passed=$((passed + 1))
    echo "ok: $1: $(grep -E '^Done|^#[0-9]+.*DONE' "$3" | tail -1 | cut -c1-120) $(grep -E '^Done' "$3" | tail -1)"
  else
    failed=$((failed + 1)); echo "FAIL: $1"; grep -E "ERROR|SUMMARY|runtime error|Test unit written" "$3" | head -10
  fi
}
verdict state_dict $rc "$work/fuzz.log"

# The reader targets: the readers instrumented, the rest from the build.
build=${2:-$root/build}
reader_runs=${3:-30000}
budget=(-runs="$reader_runs")
[ -n "${LOCKSTEP_FUZZ_SECONDS:-}" ] && budget=(-max_total_time="$LOCKSTEP_FUZZ_SECONDS")
# The fuzzers compile against Debian's LibTorch (above); a build against
# another one (scripts/test_pip.sh's) cannot lend them its libraries. The
# readers are the same code on every platform: the Debian suites fuzz them,
# every platform replays their corpus (fuzz.replay_readers).
if ! grep -q '^Torch_DIR:PATH=/usr/' "$build/CMakeCache.txt" 2>/dev/null; then
  echo "the reader targets: skipped here, $build was built against $(sed -n 's/^Torch_DIR:PATH=//p' "$build/CMakeCache.txt" 2>/dev/null) (they run against Debian's LibTorch)"
  echo "$passed passed, $failed failed"
  [ "$failed" -eq 0 ]
  exit
fi
if [ ! -f "$build/liblockstep_data.a" ]; then
  echo "FAIL: no $build/liblockstep_data.a: build lockstep first"
  echo "$passed passed, $((failed + 1)) failed"
  exit 1
fi
python3 "$root/tests/fuzz/make_reader_corpus.py" "$work/reader_seeds" || { echo "0 passed, 1 failed"; exit 1; }
mkdir -p "$work/obj"
sources=(tests/fuzz/fuzz_readers.cpp src/data/bpe.cpp src/data/vocab_files.cpp src/data/tokens.cpp src/io/safetensors.cpp
         src/io/shard_index.cpp src/util/json.cpp src/util/fs.cpp src/util/utf8.cpp src/util/progress.cpp)
objects=()
for src in "${sources[@]}"; do
  obj="$work/obj/$(basename "$src" .cpp).o"
  if ! "$cxx" "${flags[@]/-fsanitize=fuzzer,address,undefined/-fsanitize=fuzzer-no-link,address,undefined}" \
      -I"$root/src/data" -I"$root/tests/fuzz" -c "$root/$src" -o "$obj" 2>"$work/build.log"; then
    tail -20 "$work/build.log"; echo "$passed passed, $((failed + 1)) failed"; exit 1
  fi
  objects+=("$obj")
done
libs=("$build"/liblockstep_data.a "$build"/liblockstep_io.a "$build"/liblockstep_util.a "$build"/liblockstep_base.a)
for target in vocab safetensors shard_index token_file progress; do
  if ! "$cxx" "${flags[@]}" -I"$root/tests/fuzz" -DLOCKSTEP_FUZZ_ENTRY=read_$target \
      "$root/tests/fuzz/fuzz_entry.cpp" "${objects[@]}" "${libs[@]}" \
      -lyaml-cpp -lspdlog -lfmt -lxxhash -lcrypto -lz -ltorch -ltorch_cpu -lc10 -o "$work/fuzz_$target" 2>"$work/build.log"; then
    tail -20 "$work/build.log"; failed=$((failed + 1)); continue
  fi
  mkdir -p "$work/corpus_$target" "$work/seeds_$target"
  # Seeds up to 1 MiB (the large hostile files are the replay's).
  find "$work/reader_seeds/$target" -type f -size -1024k -exec cp {} "$work/seeds_$target/" \;
  ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=1 TMPDIR=/dev/shm \
    "$work/fuzz_$target" -seed=1 "${budget[@]}" -rss_limit_mb=1024 -malloc_limit_mb=512 \
    -timeout=20 -max_len=65536 "$work/corpus_$target" "$work/seeds_$target" >"$work/fuzz_$target.log" 2>&1
  verdict "$target" $? "$work/fuzz_$target.log"
done
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
