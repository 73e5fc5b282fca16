#!/usr/bin/env bash
# lockstep tokenize (GPT-2's byte-level BPE, docs/models.md) against the
# reference, tiktoken itself (tests/python/tiktoken_reference.py), built
# offline from the same GPT-2 ranks (gpt2.tiktoken from PyPI's
# openai-whisper, installed by scripts/fetch_gpt2_vocab.sh):
# 1. parity: every token id equal on ~10 MB of varied text: the KJV, 5 MB of
#    Debian's documentation (licences and copyright files), and 1 MiB of
#    Unicode edge cases with invalid UTF-8 (tests/python/unicode_edge_cases.py);
#    on 1 and 2 threads; decode(encode(x)) == x for each;
# 2. the split (--val-fraction), --eot, llm.c's header format; the same
#    ranks as GPT-2's encoder.json/vocab.bpe and as tokenizer.json files;
# 3. throughput beside the reference (printed; docs/performance.md);
# 4. bad input: exit 2 naming what is wrong.
# Skipped (exit 77, saying why) where tiktoken or the ranks are absent.
#   tokenize.sh LOCKSTEP LOCKSTEP_RUN
source "$(dirname "$0")/lib.sh"
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "$(dirname "$LOCKSTEP")" && pwd)
ranks="$build/share/lockstep/gpt2/gpt2.tiktoken"
TT=${LOCKSTEP_TOOLS_PYTHON:-$build/venv-tools/bin/python}
if [ ! -f "$ranks" ] || ! "$TT" -c "import tiktoken" 2>/dev/null; then
  echo "SKIP: GPT-2's ranks ($ranks, scripts/fetch_gpt2_vocab.sh) or tiktoken ($TT, scripts/python_tools.sh) is absent here"
  exit 77
fi
reference() {  # reference FILE OUT [--special]: prints "<bytes> <tokens> <seconds>"
  "$TT" "$root/tests/python/tiktoken_reference.py" "$ranks" "$@"
}
"$TT" "$root/tests/python/unicode_edge_cases.py" "$WORK/edge.bin" 1
(cat /usr/share/common-licenses/* /usr/share/doc/*/copyright) 2>/dev/null | head -c 5000000 >"$WORK/debian.txt"
corpus=("$root/data/kjv.txt" "$WORK/debian.txt" "$WORK/edge.bin")
total=0
for f in "${corpus[@]}"; do total=$((total + $(stat -c %s "$f"))); done
[ "$total" -ge 10000000 ] && pass "the corpus is $total bytes" || fail "the corpus is only $total bytes"

# 1. Parity, file by file, and the round trip.
ref_s=0
for f in "${corpus[@]}"; do
  b=$(basename "$f")
  read -r _ _ s < <(reference "$f" "$WORK/$b.ref")
  ref_s=$(awk -v a="$ref_s" -v b="$s" 'BEGIN{print a + b}')
  "$LOCKSTEP" tokenize "$f" --out "$WORK/t-$b" --val-fraction 0 --threads 1 2>"$WORK/t-$b.err"
  expect_eq "$?" 0 "tokenize $b"
  cmp -s "$WORK/t-$b/train.bin" "$WORK/$b.ref" && pass "$b: every id equals the reference's ($(($(stat -c %s "$WORK/$b.ref") / 2)) tokens)" ||
    fail "$b: ids differ from the reference (cmp: $(cmp "$WORK/t-$b/train.bin" "$WORK/$b.ref" 2>&1 | head -1))"
  "$LOCKSTEP" tokenize --decode "$WORK/t-$b/train.bin" >"$WORK/$b.back" 2>/dev/null
  cmp -s "$WORK/$b.back" "$f" && pass "$b: decode(encode(x)) == x" || fail "$b: the round trip differs"
done
# All three at once on 2 threads: the same ids, in input order.
cat "$WORK/kjv.txt.ref" "$WORK/debian.txt.ref" "$WORK/edge.bin.ref" >"$WORK/all.ref"
start=$(date +%s.%N)
"$LOCKSTEP" tokenize "${corpus[@]}" --out "$WORK/t2" --val-fraction 0 --threads 2 2>"$WORK/t2.err"
end=$(date +%s.%N)
cmp -s "$WORK/t2/train.bin" "$WORK/all.ref" && pass "3 files on 2 threads: the same ids in input order" || fail "2 threads differ"
start1=$(date +%s.%N)
"$LOCKSTEP" tokenize "${corpus[@]}" --out "$WORK/t1" --val-fraction 0 --threads 1 2>"$WORK/t1.err"
end1=$(date +%s.%N)
rate() { grep -o "[0-9.]* MB/s on [0-9]* thread" "$1" | tail -1 | awk '{print $1}'; }
echo "throughput on $total bytes ($(lscpu | sed -n 's/^Model name: *//p')): reference (tiktoken 0.14, one thread) $(awk -v t="$total" -v s="$ref_s" 'BEGIN{printf "%.1f", t / 1e6 / s}') MB/s;" \
  "lockstep 1 thread $(rate "$WORK/t1.err") MB/s, 2 threads $(rate "$WORK/t2.err") MB/s (encoding and writing);" \
  "whole commands, loading the vocabulary included: $(awk -v t="$total" -v a="$start1" -v b="$end1" 'BEGIN{printf "%.1f", t / 1e6 / (b - a)}')" \
  "and $(awk -v t="$total" -v a="$start" -v b="$end" 'BEGIN{printf "%.1f", t / 1e6 / (b - a)}') MB/s"
expect_grep "$WORK/t2.err" "tokenize: [0-9,]+ bytes in 3 file\(s\) -> [0-9,]+ tokens .* MB/s on 2 thread\(s\)" "it says what it did, with MB/s"

# 2. The split, --eot, llm.c's format.
"$LOCKSTEP" tokenize "$root/data/kjv.txt" --out "$WORK/split" --val-fraction 0.1 2>/dev/null
cat "$WORK/split/train.bin" "$WORK/split/val.bin" | cmp -s - "$WORK/kjv.txt.ref" &&
  pass "--val-fraction 0.1: train.bin + val.bin are the whole text's ids" || fail "the split lost or changed ids"
"$LOCKSTEP" tokenize --decode "$WORK/split/val.bin" >"$WORK/val.txt" 2>/dev/null
share=$(awk -v v="$(stat -c %s "$WORK/val.txt")" -v t="$(stat -c %s "$root/data/kjv.txt")" 'BEGIN{printf "%.3f", v / t}')
awk -v s="$share" 'BEGIN{exit !(s > 0.099 && s < 0.101)}' && pass "val.bin holds the text's last 10% ($share)" || fail "val.bin holds $share of the text"
# Text whose lines end in CRLF, in CJK or in spaces still splits (a cut is
# any space or line end after other text), and the parts are the whole.
head -c 1500000 "$root/data/kjv.txt" | sed 's/$/\r/' >"$WORK/crlf.txt"
(for i in $(seq 1 20000); do printf '这是第%d行。\n' "$i"; done) >"$WORK/cjk.txt"
for t in crlf cjk; do
  reference "$WORK/$t.txt" "$WORK/$t.ref" >/dev/null
  "$LOCKSTEP" tokenize "$WORK/$t.txt" --out "$WORK/split-$t" --val-fraction 0.1 2>"$WORK/split-$t.err"
  [ -s "$WORK/split-$t/val.bin" ] && cat "$WORK/split-$t/train.bin" "$WORK/split-$t/val.bin" | cmp -s - "$WORK/$t.ref" &&
    pass "$t lines: val.bin is not empty and train + val are the reference's ids" ||
    fail "$t lines: the split is empty or changed ids ($(tail -1 "$WORK/split-$t.err"))"
done
"$LOCKSTEP" tokenize "$WORK/edge.bin" "$WORK/edge.bin" --eot --out "$WORK/eot" --val-fraction 0 2>/dev/null
out=$($PY - "$WORK/eot/train.bin" "$WORK/edge.bin.ref" <<'PY'
import sys, struct
a = open(sys.argv[1], "rb").read(); r = open(sys.argv[2], "rb").read()
eot = struct.pack("<H", 50256)
print(a == r + eot + r + eot)
PY
)
expect_eq "$out" "True" "--eot: <|endoftext|> (50256) after each file's tokens"
"$LOCKSTEP" tokenize "$WORK/edge.bin" --format llmc --out "$WORK/llmc" --val-fraction 0 2>/dev/null
out=$($PY - "$WORK/llmc/train.bin" "$WORK/edge.bin.ref" <<'PY'
import sys, struct
a = open(sys.argv[1], "rb").read(); r = open(sys.argv[2], "rb").read()
magic, version, count = struct.unpack("<3i", a[:12])
print(magic, version, count == len(r) // 2, a[12:1024] == bytes(1012), a[1024:] == r)
PY
)
expect_eq "$out" "20240520 1 True True True" "--format llmc: llm.c's header (magic 20240520, version 1, the count), then the ids"

# The same ranks as GPT-2's own files (encoder.json and vocab.bpe, recovered
# from the ranks: vocab.bpe byte for byte OpenAI's, by the SHA-256 tiktoken
# checks) and as Hugging Face tokenizer.json files (merges as "a b"
# strings, and as [a, b] pairs as newer versions write them): the same ids.
"$TT" "$root/tests/python/ranks_to_gpt2_files.py" "$ranks" "$WORK/gpt2files"
echo "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5  $WORK/gpt2files/vocab.bpe" | sha256sum --quiet -c - &&
  pass "the merges recovered from the ranks are GPT-2's vocab.bpe (SHA-256)" || fail "the recovered vocab.bpe is not GPT-2's"
"$LOCKSTEP" tokenize "$WORK/edge.bin" --vocab "$WORK/gpt2files" --out "$WORK/gpt2files-out" --val-fraction 0 2>/dev/null
cmp -s "$WORK/gpt2files-out/train.bin" "$WORK/edge.bin.ref" && pass "encoder.json and vocab.bpe: the reference's ids" ||
  fail "encoder.json and vocab.bpe give other ids"
$PY - "$WORK/gpt2files" "$WORK" <<'PY'
import json, sys
d, w = sys.argv[1], sys.argv[2]
vocab = json.load(open(d + "/encoder.json", encoding="utf-8"))
merges = [l for l in open(d + "/vocab.bpe", encoding="utf-8").read().split("\n")[1:] if l]
for name, ms in (("hf-strings", merges), ("hf-pairs", [m.split(" ") for m in merges])):
    doc = {"version": "1.0", "added_tokens": [{"id": 50256, "content": "<|endoftext|>", "special": True}],
           "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
           "model": {"type": "BPE", "dropout": None, "vocab": vocab, "merges": ms}}
    json.dump(doc, open(f"{w}/{name}.json", "w", encoding="utf-8"), ensure_ascii=False)
doc["pre_tokenizer"]["add_prefix_space"] = True
json.dump(doc, open(f"{w}/hf-prefix.json", "w", encoding="utf-8"))
PY
# --special through GPT-2's own files: <|endoftext|> in the text is 50256.
printf 'one<|endoftext|>two <|endoftext|> three<|endoftext\n' >"$WORK/special.txt"
reference "$WORK/special.txt" "$WORK/special.ref" --special >/dev/null
"$LOCKSTEP" tokenize "$WORK/special.txt" --vocab "$WORK/gpt2files" --special --out "$WORK/special" --val-fraction 0 2>/dev/null
cmp -s "$WORK/special/train.bin" "$WORK/special.ref" && pass "--special with encoder.json: tiktoken's encode(allowed_special=\"all\") ids" ||
  fail "--special with encoder.json gives other ids"
for form in strings pairs; do
  "$LOCKSTEP" tokenize "$WORK/edge.bin" --vocab "$WORK/hf-$form.json" --out "$WORK/hf-$form" --val-fraction 0 2>/dev/null
  cmp -s "$WORK/hf-$form/train.bin" "$WORK/edge.bin.ref" && pass "a tokenizer.json (merges as $form): the reference's ids" ||
    fail "a tokenizer.json (merges as $form) gives other ids"
done

# configs/gpt-bpe.yaml on tokenize's output (small and short here): the
# config records data.tokenizer, and generate takes and prints text.
"$LOCKSTEP_RUN" --nproc-per-node 2 --master-port 0 "$LOCKSTEP" train --config "$root/configs/gpt-bpe.yaml" \
  --set run.dir="$WORK/runs" --set data.path="$WORK/split" --set model.n_layer=1 --set model.n_embd=32 \
  --set model.n_head=2 --set model.block_size=32 --set data.batch_size=4 --set train.max_steps=6 \
  --set checkpoint.every=6 --set train.eval_batches=2 --set log.progress=plain >"$WORK/bpe.out" 2>&1
expect_eq "$?" 0 "configs/gpt-bpe.yaml trains on lockstep tokenize's files (2 ranks)"
"$LOCKSTEP" generate --checkpoint "$WORK/runs/gpt-bpe" --prompt "In the beginning" --max-new-tokens 20 --seed 1 \
  >"$WORK/gen.out" 2>&1
expect_eq "$?" 0 "generate from it with --prompt text"
expect_grep "$WORK/gen.out" "^In the beginning" "the output is text, after the prompt"
"$LOCKSTEP" generate --checkpoint "$WORK/runs/gpt-bpe" --prompt-tokens 818,262,3726 --max-new-tokens 3 \
  --temperature 0 >"$WORK/ids.out" 2>&1
expect_grep "$WORK/ids.out" "^818 262 3726( [0-9]+){3}$" "--prompt-tokens still gives ids"
cp -r "$WORK/runs/gpt-bpe/checkpoints/step_00000006" "$WORK/moved"
sed -i "s|tokenizer: .*|tokenizer: \"$WORK/vocab-gone\"|" "$WORK/moved/config.yaml"
$PY - "$WORK/moved" <<'PY'
import hashlib, os, sys
d = sys.argv[1]
lines = [l for l in open(os.path.join(d, "MANIFEST")).read().splitlines() if l.strip()]
out = []
for l in lines:
    digest, name = l.split(None, 1)
    if name.strip() == "config.yaml":
        digest = hashlib.sha256(open(os.path.join(d, "config.yaml"), "rb").read()).hexdigest()
    out.append(f"{digest}  {name.strip()}")
open(os.path.join(d, "MANIFEST"), "w").write("\n".join(out) + "\n")
PY
"$LOCKSTEP" generate --checkpoint "$WORK/moved" --prompt "In" >"$WORK/gone.out" 2>&1
expect_eq "$?" 2 "a checkpoint whose data.tokenizer is gone: exit 2"
expect_grep "$WORK/gone.out" "data.tokenizer '.*vocab-gone' of checkpoint .*: .*vocab-gone/encoder.json" "naming the tokenizer and the file"

# 4. Bad input.
bad() {  # bad WHAT PATTERN ARGS...
  local what=$1 pattern=$2
  shift 2
  "$LOCKSTEP" tokenize "$@" >"$WORK/bad.out" 2>&1
  expect_eq "$?" 2 "$what: exit 2"
  expect_grep "$WORK/bad.out" "$pattern" "$what: says so"
}
bad "an existing output" "already holds train.bin" "$WORK/edge.bin" --out "$WORK/eot"
bad "a missing input" "input '.*nothing' does not exist" "$WORK/nothing" --out "$WORK/x1"
bad "--val-fraction 1.5" "--val-fraction 1.5.* is outside \[0, 1\)" "$WORK/edge.bin" --out "$WORK/x2" --val-fraction 1.5
mkdir -p "$WORK/vocab"
bad "a vocabulary folder without files" "vocab/encoder.json" "$WORK/edge.bin" --out "$WORK/x3" --vocab "$WORK/vocab"
head -c 100000 "$WORK/gpt2files/encoder.json" >"$WORK/vocab/encoder.json"
bad "a truncated encoder.json" "encoder.json: not valid JSON at byte (999[0-9][0-9]|100000)" "$WORK/edge.bin" --out "$WORK/x4" --vocab "$WORK/vocab"
cp "$WORK/gpt2files/encoder.json" "$WORK/vocab/"
printf '#version: 0.2\nĠ t\nq q q\n' >"$WORK/vocab/vocab.bpe"
bad "a malformed merge" "vocab.bpe line 3: not two tokens separated by one space" "$WORK/edge.bin" --out "$WORK/x5" --vocab "$WORK/vocab"
head -c 9000000 /dev/zero | tr '\0' 'a' >"$WORK/long.txt"
bad "9 MiB without a line end" "long.txt: 8 MiB from byte 0 without a space, tab or line end next to other text" "$WORK/long.txt" --out "$WORK/x6"
bad "a tokenizer.json with add_prefix_space" "hf-prefix.json: pre_tokenizer.add_prefix_space is true" "$WORK/edge.bin" --out "$WORK/x7" --vocab "$WORK/hf-prefix.json"
printf 'abc' >"$WORK/odd.bin"
printf '#version: 0.2\nĠ t\nĠ t\n' >"$WORK/vocab/vocab.bpe"
bad "a merge given twice" "vocab.bpe line 3: the same pair is merged twice" "$WORK/edge.bin" --out "$WORK/x8" --vocab "$WORK/vocab"
[ ! -e "$WORK/x8/train.bin" ] && [ ! -e "$WORK/x6/train.bin" ] && pass "a failed run leaves no train.bin behind" ||
  fail "a failed run left train.bin"
bad "decoding a file of odd length" "odd.bin'.*odd" --decode "$WORK/odd.bin"
printf '\x01\x00\xff\xff' >"$WORK/big.bin"
bad "decoding an id outside the vocabulary" "token 1 is id 65535, outside the vocabulary's 50257" --decode "$WORK/big.bin"
# Rank files read as hostile too: each refusal names the file and line.
head -5 "$ranks" >"$WORK/bad1.tiktoken"; echo 'not*base64 5' >>"$WORK/bad1.tiktoken"
bad "a rank file with a line that is no base64" "bad1.tiktoken line 6: not a base64 token, a space and a rank" "$WORK/edge.bin" --out "$WORK/x9" --vocab "$WORK/bad1.tiktoken"
(head -256 "$ranks"; echo "$(printf 'xyz' | base64) 256") >"$WORK/bad2.tiktoken"
bad "a rank file whose token is no join of two tokens" "bad2.tiktoken: the token of rank 256 is not the join of two tokens" "$WORK/edge.bin" --out "$WORK/x10" --vocab "$WORK/bad2.tiktoken"
(head -256 "$ranks"; echo "$(printf 'ab' | base64) 300") >"$WORK/bad3.tiktoken"
bad "a rank file with a gap" "bad3.tiktoken: no token has rank 256" "$WORK/edge.bin" --out "$WORK/x11" --vocab "$WORK/bad3.tiktoken"
finish
