#!/usr/bin/env bash
# The state-dict fuzz corpus (make_corpus.py: valid files and the hostile ones
# of issue 16), replayed through the fuzz target's entry point: valid files
# load, every other one is refused with a DataError that says why, none
# crashes, and none raises peak memory by more than 64 MB plus 4x its size.
# And end to end: `lockstep train` given hostile files as model.init_from
# exits 2 naming the file and the fault (before: a segfault or gigabytes).
# Usage: replay.sh REPLAY_BINARY LOCKSTEP
set -u
source "$(dirname "$0")/../multiproc/lib.sh" "$2" unused
root=$(cd "$(dirname "$0")/../.." && pwd)
here=$(cd "$(dirname "$0")" && pwd)
/usr/bin/python3 "$here/make_corpus.py" "$WORK/corpus" 2>"$WORK/py.err" ||
  { fail "could not write the corpus: $(tail -1 "$WORK/py.err")"; finish; exit 1; }
base=$("$1" "$WORK/corpus/empty_file.pt" | sed -n 's/.*peak \([0-9]*\) kB$/\1/p')
for f in "$WORK"/corpus/*; do
  name=$(basename "$f")
  out=$("$1" "$f" 2>&1)
  rc=$?
  [ "$rc" -eq 0 ] || { fail "$name: the reader ended with $rc: $out"; continue; }
  peak=$(sed -n 's/.*peak \([0-9]*\) kB$/\1/p' <<<"$out")
  size_kb=$(( $(stat -c %s "$f") / 1024 ))
  limit=$((base + 65536 + 4 * size_kb))
  [ -n "$peak" ] && [ "$peak" -le "$limit" ] && pass "$name: peak memory ${peak} kB <= ${limit} kB" ||
    fail "$name: peak memory ${peak:-?} kB over ${limit} kB"
  case "$name" in
    valid_*) grep -q ": ok;" <<<"$out" && pass "$name loads" || fail "$name: $out" ;;
    *) grep -q ": refused: $f: " <<<"$out" && pass "$name is refused, naming the file" ||
         fail "$name: $out" ;;
  esac
done
expect_why() {  # expect_why REPLAY FILE PATTERN
  grep -qE "$3" <<<"$("$1" "$WORK/corpus/$2" 2>&1)" && pass "$2: says '$3'" || fail "$2 does not say '$3'"
}
expect_why "$1" binput_empty_stack.pt "memo of an empty stack"
expect_why "$1" tuple1_empty_stack.pt "stack underflow"
expect_why "$1" nested_tuple1_million.pt "nested more than 64 deep"
expect_why "$1" nested_lists.pt "nested more than 64 deep"
expect_why "$1" stride0_blowup.pt "268435456 elements over a storage of 1"
expect_why "$1" storage_truncated.pt "claims 1048576 elements but its record has"
expect_why "$1" deflated_record.pt "is compressed; torch.save stores records uncompressed"
expect_why "$1" unknown_global.pt "unsupported object os.system"
expect_why "$1" long1_too_wide.pt "integer wider than 64 bits"
for f in binput_empty_stack.pt nested_tuple1_million.pt stride0_blowup.pt tuple2_short_stack.pt; do
  "$LOCKSTEP" train --config "$root/configs/digits.yaml" --set run.dir="$WORK/runs" \
    --set model.init_from="$WORK/corpus/$f" >"$WORK/out" 2>&1
  expect_eq "$?" 2 "lockstep train with model.init_from=$f exits 2"
  expect_grep "$WORK/out" "bad data: model.init_from: $WORK/corpus/$f: " "and names the key and the file"
done
"$LOCKSTEP" train --config "$root/configs/digits.yaml" --set run.dir="$WORK/runs" \
  --set model.init_from=/dev/zero >"$WORK/out" 2>&1
expect_eq "$?" 2 "model.init_from=/dev/zero exits 2 at once"
expect_grep "$WORK/out" "'/dev/zero' is not a regular file" "saying it is not a regular file"
finish
