#!/usr/bin/env bash
# The reader fuzz corpus (make_reader_corpus.py) replayed through each
# target's entry (fuzz_readers.cpp), one process per file: valid_* files are
# read, every other one is refused with a DataError that says why, none
# crashes, and none raises peak memory past 64 MB plus 16x its size (the
# vocabulary readers' bound, Note [Bounded JSON]: at most 9x in the
# document; the harness itself holds the bytes about 3 times over). And
# the issue's case by number: 3 million JSON values (6 MB) stay under 0.3 GB,
# where the tree reader held about 0.7 GB.
# Usage: replay_readers.sh REPLAY_BINARY LOCKSTEP
set -u
source "$(dirname "$0")/../multiproc/lib.sh" "$2" unused
here=$(cd "$(dirname "$0")" && pwd)
python3 "$here/make_reader_corpus.py" "$WORK/corpus" 2>"$WORK/py.err" ||
  { fail "could not write the corpus: $(tail -1 "$WORK/py.err")"; finish; exit 1; }
base=$("$1" progress "$WORK/corpus/progress/valid_records.txt" | sed -n 's/.*peak \([0-9]*\) kB$/\1/p')
for dir in "$WORK"/corpus/*; do
  target=$(basename "$dir")
  for f in "$dir"/*; do
    name="$target/$(basename "$f")"
    out=$("$1" "$target" "$f" 2>&1)
    rc=$?
    [ "$rc" -eq 0 ] || { fail "$name: the reader ended with $rc: $(tail -3 <<<"$out")"; continue; }
    peak=$(sed -n 's/.*peak \([0-9]*\) kB$/\1/p' <<<"$out")
    size_kb=$(( $(stat -c %s "$f") / 1024 ))
    limit=$((base + 65536 + 16 * size_kb))
    if [ -n "$peak" ] && [ "$peak" -le "$limit" ]; then
      pass "$name: peak memory ${peak} kB <= ${limit} kB"
    else
      fail "$name: peak memory ${peak:-?} kB over ${limit} kB"
    fi
    case "$(basename "$f")" in
      valid_*) grep -q ": ok;" <<<"$out" && pass "$name is read" || fail "$name: $out" ;;
      *) grep -q ": refused: " <<<"$out" && pass "$name is refused: $(sed 's/.*refused: //; s/; peak.*//' <<<"$out" | cut -c1-150)" ||
           fail "$name: $out" ;;
    esac
  done
done
why() {  # why TARGET FILE PATTERN
  if grep -qE -- "$3" <<<"$("$REPLAY" "$1" "$WORK/corpus/$1/$2" 2>&1)"; then
    pass "$1/$2 says '$3'"
  else
    fail "$1/$2 does not say '$3': $("$REPLAY" "$1" "$WORK/corpus/$1/$2" 2>&1 | cut -c1-300)"
  fi
}
REPLAY=$1
why vocab zeros_over_limit.json "more than 3000000 values"
why vocab deep_arrays.json "nested deeper than 64"
why vocab lone_surrogate.json "lone surrogate"
why vocab merges_outnumber_tokens.bin "more merges than the 262 tokens"
why vocab merge_twice.bin "the same pair is merged twice"
why vocab missing_byte_token.bin "no token for byte 7"
why vocab prefix_space.json "add_prefix_space is true"
why vocab digits_pretokenizer.json "pre_tokenizer holds a Digits where lockstep reads"
why vocab ranks_gap.tiktoken "no token has rank 256"
why vocab ranks_no_join.tiktoken "rank 256 is not the join of two tokens"
why vocab ranks_same_token.tiktoken "listed under an earlier rank too"
why vocab ranks_sparse_huge.tiktoken "no token has rank 0"
why vocab ranks_long_token.tiktoken "a token of 2000 bytes, over the 1024"
why vocab ranks_costly.tiktoken "too long to find their merges"
why safetensors header_length_huge.safetensors "header"
why safetensors offsets_overlap.safetensors "overlap"
why shard_index bytes_overflow.txt "overflow"
why shard_index truncated.txt "truncated"
why token_file count_lies.bin "announces 1000 tokens"
why token_file unknown_magic.bin "magic 20991231"
why progress step_over_total.txt "1 of 1 lines"
peak=$("$REPLAY" vocab "$WORK/corpus/vocab/zeros_3m_values.json" | sed -n 's/.*peak \([0-9]*\) kB$/\1/p')
expect_lt "$(( ${peak:-999999999} - base ))" 307200 "3 million JSON values (6 MB) cost under 0.3 GB over the reader's base (kB)"
finish
