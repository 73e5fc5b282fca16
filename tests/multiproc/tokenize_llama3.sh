#!/usr/bin/env bash
# lockstep tokenize with Llama 3's tokenizer (docs/models.md, "Tokenizers")
# against the references: tiktoken itself built as Meta's tokenizer.py
# builds it (tests/python/tiktoken_reference.py) on Llama 3's own
# tokenizer.model (PyPI llama-models, scripts/fetch_llama3_tokenizer.sh), and
# Hugging Face's tokenizers on the tokenizer.json transformers' converter
# makes of it (Llama 3's kind: a Split with its pattern, a ByteLevel without
# its own regex, ignore_merges):
# 1. parity: every id equal on ~9 MB (the KJV, Debian's licences, 1 MiB of
#    Unicode edge cases with invalid UTF-8), on 1 and 2 threads; decode;
# 2. llm.c's Llama 3 layout (magic 20240801, version 7, uint32), --eot as
#    <|end_of_text|>, nanoGPT's uint16 refused; --special (chat templates)
#    as tiktoken's encode(allowed_special="all");
# 3. a small Llama trains on those uint32 files and generates text; with
#    transformers, docs/models.md's fine-tune on a folder laid out as the
#    Hub's Llama 3.2 (rope scaling, tied, tokenizer.json), export and
#    generate, the export's logits in transformers equal to lockstep's;
# 4. bad input: exit 2 naming what is wrong.
# Skipped (exit 77, saying why) where tiktoken or the file is absent; the
# tokenizer.json part where transformers is.
#   tokenize_llama3.sh LOCKSTEP LOCKSTEP_RUN
source "$(dirname "$0")/lib.sh"
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "$(dirname "$LOCKSTEP")" && pwd)
model="$build/test-data/llama3/tokenizer.model"
TT=${LOCKSTEP_TOOLS_PYTHON:-$build/venv-tools/bin/python}
if [ ! -f "$model" ] || ! "$TT" -c "import tiktoken" 2>/dev/null; then
  echo "SKIP: Llama 3's tokenizer.model ($model, scripts/fetch_llama3_tokenizer.sh) or tiktoken ($TT, scripts/python_tools.sh) is absent here"
  exit 77
fi
reference() { "$TT" "$root/tests/python/tiktoken_reference.py" "$model" "$@"; }
"$TT" "$root/tests/python/unicode_edge_cases.py" "$WORK/edge.bin" 1
(cat /usr/share/common-licenses/* /usr/share/doc/*/copyright) 2>/dev/null | head -c 3000000 >"$WORK/debian.txt"
corpus=("$root/data/kjv.txt" "$WORK/debian.txt" "$WORK/edge.bin")
llmc_ids() { tail -c +1025 "$1"; }  # the ids after llm.c's 1 KiB header

# 1. Parity and the round trip.
for f in "${corpus[@]}"; do
  b=$(basename "$f")
  reference "$f" "$WORK/$b.ref" >/dev/null
  "$LOCKSTEP" tokenize "$f" --vocab "$model" --format llmc --out "$WORK/t-$b" --val-fraction 0 --threads 1 2>"$WORK/t-$b.err"
  expect_eq "$?" 0 "tokenize $b with Llama 3's tokenizer.model"
  llmc_ids "$WORK/t-$b/train.bin" | cmp -s - "$WORK/$b.ref" &&
    pass "$b: every id equals tiktoken's ($(($(stat -c %s "$WORK/$b.ref") / 4)) tokens)" ||
    fail "$b: ids differ from tiktoken's ($(llmc_ids "$WORK/t-$b/train.bin" | cmp - "$WORK/$b.ref" 2>&1 | head -1))"
  "$LOCKSTEP" tokenize --vocab "$model" --decode "$WORK/t-$b/train.bin" >"$WORK/$b.back" 2>/dev/null
  cmp -s "$WORK/$b.back" "$f" && pass "$b: decode(encode(x)) == x" || fail "$b: the round trip differs"
done
cat "$WORK/kjv.txt.ref" "$WORK/debian.txt.ref" "$WORK/edge.bin.ref" >"$WORK/all.ref"
"$LOCKSTEP" tokenize "${corpus[@]}" --vocab "$model" --format llmc --out "$WORK/t2" --val-fraction 0 --threads 2 2>/dev/null
llmc_ids "$WORK/t2/train.bin" | cmp -s - "$WORK/all.ref" && pass "3 files on 2 threads: the same ids in input order" ||
  fail "2 threads differ"
# CRLF lines split only where Llama 3's pattern starts afresh (not before
# a line end: ".\r\n" is one piece), and train + val are the whole.
head -c 1500000 "$root/data/kjv.txt" | sed 's/$/\r/' >"$WORK/crlf.txt"
reference "$WORK/crlf.txt" "$WORK/crlf.ref" >/dev/null
"$LOCKSTEP" tokenize "$WORK/crlf.txt" --vocab "$model" --format llmc --out "$WORK/split" --val-fraction 0.1 --threads 2 2>/dev/null
[ "$(stat -c %s "$WORK/split/val.bin")" -gt 1024 ] && cat <(llmc_ids "$WORK/split/train.bin") <(llmc_ids "$WORK/split/val.bin") | cmp -s - "$WORK/crlf.ref" &&
  pass "CRLF text split 90/10: val.bin is not empty and train + val are tiktoken's ids" || fail "the split is empty or changed ids"

# 10 MB of CJK lines with no space at all: cut after the line ends (the
# chunks are encoded on 2 threads), every id tiktoken's.
"$TT" -c "
import random
r = random.Random(1)
open('$WORK/cjk.txt', 'w').write(''.join(''.join(chr(r.randint(0x4E00, 0x9FFF)) for _ in range(40)) + '。\n' for _ in range(80000)))"
reference "$WORK/cjk.txt" "$WORK/cjk.ref" >/dev/null
"$LOCKSTEP" tokenize "$WORK/cjk.txt" --vocab "$model" --format llmc --out "$WORK/cjk" --val-fraction 0 --threads 2 2>"$WORK/cjk.err"
llmc_ids "$WORK/cjk/train.bin" | cmp -s - "$WORK/cjk.ref" && pass "10 MB of CJK lines without a space: tiktoken's ids" ||
  fail "CJK lines without a space: $(tail -1 "$WORK/cjk.err")"

# --special: chat-formatted text (Llama 3's template around KJV verses), its
# special tokens' names read as their ids, as tiktoken's
# encode(allowed_special="all"); on 2 threads.
"$TT" - "$root/data/kjv.txt" "$WORK/chat.txt" <<'PY'
import sys
verses = [l for l in open(sys.argv[1], encoding="utf-8").read().split("\n") if l.strip()][:20000]
turn = "<|start_header_id|>{}<|end_header_id|>\n\n{}<|eot_id|>"
with open(sys.argv[2], "w", encoding="utf-8") as f:
    for k in range(0, len(verses) - 1, 2):
        f.write("<|begin_of_text|>" + turn.format("user", verses[k]) + turn.format("assistant", verses[k + 1]) + "\n")
PY
reference "$WORK/chat.txt" "$WORK/chat.ref" --special >/dev/null
"$LOCKSTEP" tokenize "$WORK/chat.txt" --vocab "$model" --format llmc --special --out "$WORK/chat" --val-fraction 0 --threads 2 2>"$WORK/chat.err"
llmc_ids "$WORK/chat/train.bin" | cmp -s - "$WORK/chat.ref" &&
  pass "--special: a chat template's names are their ids, as tiktoken's encode(allowed_special=\"all\") ($(($(stat -c %s "$WORK/chat.ref") / 4)) tokens)" ||
  fail "--special: other ids than tiktoken's ($(tail -1 "$WORK/chat.err"))"

# 2. The file layout, --eot.
out=$("$TT" - "$WORK/t-edge.bin/train.bin" "$WORK/edge.bin.ref" <<'PY'
import sys, struct
a = open(sys.argv[1], "rb").read(); r = open(sys.argv[2], "rb").read()
magic, version, count = struct.unpack("<3i", a[:12])
print(magic, version, count == len(r) // 4, a[12:1024] == bytes(1012))
PY
)
expect_eq "$out" "20240801 7 True True" "--format llmc: llm.c's Llama 3 header (magic 20240801, version 7, the count), then uint32 ids"
"$LOCKSTEP" tokenize "$WORK/edge.bin" "$WORK/edge.bin" --vocab "$model" --format llmc --eot --out "$WORK/eot" --val-fraction 0 2>/dev/null
out=$("$TT" - "$WORK/eot/train.bin" "$WORK/edge.bin.ref" <<'PY'
import sys, struct
a = open(sys.argv[1], "rb").read()[1024:]; r = open(sys.argv[2], "rb").read()
eot = struct.pack("<I", 128001)
print(a == r + eot + r + eot)
PY
)
expect_eq "$out" "True" "--eot: <|end_of_text|> (128001) after each file's tokens"
"$LOCKSTEP" tokenize "$WORK/edge.bin" --vocab "$model" --out "$WORK/u16" --val-fraction 0 >"$WORK/u16.out" 2>&1
expect_eq "$?" 2 "nanoGPT's uint16 format with 128,256 tokens: exit 2"
expect_grep "$WORK/u16.out" "128256 tokens: more than nanoGPT's uint16 files hold; give --format llmc" "it says why and what to give"

# The tokenizer.json of Llama 3's kind: Hugging Face's tokenizers is the judge.
if "$TT" -c "import transformers, tokenizers" 2>/dev/null; then
  "$TT" "$root/tests/python/llama3_tokenizer_json.py" make "$model" "$WORK/hf/tokenizer.json" >"$WORK/hf.out" 2>&1 ||
    fail "transformers' TikTokenConverter: $(tail -1 "$WORK/hf.out")"
  for f in "$root/data/kjv.txt" "$WORK/debian.txt"; do
    b=$(basename "$f")
    "$TT" "$root/tests/python/llama3_tokenizer_json.py" encode "$WORK/hf/tokenizer.json" "$f" "$WORK/$b.hf"
    "$LOCKSTEP" tokenize "$f" --vocab "$WORK/hf" --format llmc --out "$WORK/j-$b" --val-fraction 0 2>/dev/null
    llmc_ids "$WORK/j-$b/train.bin" | cmp -s - "$WORK/$b.hf" && cmp -s "$WORK/$b.hf" "$WORK/$b.ref" &&
      pass "$b through tokenizer.json: Hugging Face's ids, and tiktoken's" || fail "$b through tokenizer.json: other ids"
  done
  # An added token of non-ASCII text, matched with --special as Hugging
  # Face's tokenizers matches it.
  "$TT" - "$WORK/hf/tokenizer.json" "$WORK/added" <<'PY'
import json, os, sys
doc = json.load(open(sys.argv[1], encoding="utf-8"))
doc["added_tokens"].append({"id": 128256, "content": "‹|café|>", "single_word": False, "lstrip": False,
                            "rstrip": False, "normalized": False, "special": True})
os.makedirs(sys.argv[2], exist_ok=True)
json.dump(doc, open(sys.argv[2] + "/tokenizer.json", "w", encoding="utf-8"), ensure_ascii=False)
open(sys.argv[2] + "/text.txt", "w", encoding="utf-8").write("x‹|café|>y, and ‹|café|> again ‹|caf\n" * 1000)
PY
  "$TT" "$root/tests/python/llama3_tokenizer_json.py" encode "$WORK/added/tokenizer.json" "$WORK/added/text.txt" "$WORK/added.hf"
  "$LOCKSTEP" tokenize "$WORK/added/text.txt" --vocab "$WORK/added" --special --format llmc --out "$WORK/added-out" --val-fraction 0 2>/dev/null
  llmc_ids "$WORK/added-out/train.bin" | cmp -s - "$WORK/added.hf" &&
    pass "--special with an added token of non-ASCII text: Hugging Face's ids" || fail "an added token of non-ASCII text: other ids"
  # Bad input: another Split pattern (Qwen2's one digit a piece), a
  # ByteLevel that would cut again, a rank file that is not Llama 3's.
  "$TT" - "$WORK/hf/tokenizer.json" "$WORK" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1], encoding="utf-8"))
split, byte_level = doc["pre_tokenizer"]["pretokenizers"]
split["pattern"]["Regex"] = split["pattern"]["Regex"].replace("{1,3}", "")
json.dump(doc, open(sys.argv[2] + "/qwen.json", "w", encoding="utf-8"), ensure_ascii=False)
split["pattern"]["Regex"] = split["pattern"]["Regex"].replace("\\p{N}|", "\\p{N}{1,3}|")
byte_level["use_regex"] = True
json.dump(doc, open(sys.argv[2] + "/recut.json", "w", encoding="utf-8"), ensure_ascii=False)
PY
  "$LOCKSTEP" tokenize "$WORK/edge.bin" --vocab "$WORK/qwen.json" --format llmc --out "$WORK/x1" >"$WORK/x1.out" 2>&1
  expect_eq "$?" 2 "a Split of another pattern: exit 2"
  expect_grep "$WORK/x1.out" "qwen.json: pre_tokenizer's Split pattern .* is not Llama 3's" "it names the file and the field"
  "$LOCKSTEP" tokenize "$WORK/edge.bin" --vocab "$WORK/recut.json" --format llmc --out "$WORK/x2" >"$WORK/x2.out" 2>&1
  expect_eq "$?" 2 "a ByteLevel with use_regex after the Split: exit 2"
  expect_grep "$WORK/x2.out" "recut.json: the ByteLevel after Llama 3's Split has use_regex true" "it says why"
  # docs/models.md's fine-tune, on a folder laid out as the Hub's Llama 3.2
  # (small and random): Llama 3.1's rope scaling, a tied head, its
  # tokenizer.json; 2 ranks, ZeRO-3, bf16; export; generate.
  J="$root/tests/python/llama3_tokenizer_json.py"
  "$TT" "$J" hub "$WORK/hf/tokenizer.json" "$WORK/hub" >"$WORK/hub.out" 2>&1 || fail "the Hub-like folder: $(tail -1 "$WORK/hub.out")"
  "$LOCKSTEP" tokenize "$root/data/kjv.txt" --vocab "$WORK/hub" --format llmc --out "$WORK/ft-tokens" 2>/dev/null
  "$LOCKSTEP_RUN" --nproc-per-node 2 --master-port 0 "$LOCKSTEP" train --config "$root/configs/llama-tiny.yaml" \
    --set run.dir="$WORK/runs" --set run.name=ft --set model.init_from="$WORK/hub" --set model.n_layer=2 \
    --set model.n_embd=64 --set model.n_head=4 --set model.n_kv_head=2 --set model.intermediate_size=128 \
    --set model.rope_theta=500000 --set model.rope_scaling=llama3 --set model.rope_factor=32 \
    --set model.block_size=32 --set data.vocab_size=128256 --set data.path="$WORK/ft-tokens" \
    --set data.tokenizer="$WORK/hub" --set train.precision=bf16 --set optim.lr=2e-5 --set data.batch_size=4 \
    --set train.max_steps=4 --set checkpoint.every=4 --set train.eval_batches=2 --set log.progress=plain \
    >"$WORK/ft.out" 2>&1
  expect_eq "$?" 0 "fine-tune of a Hub-layout Llama 3.2 folder: 2 ranks, ZeRO-3, bf16, its tokenizer.json"
  "$LOCKSTEP" export --checkpoint "$WORK/runs/ft" --out "$WORK/ft-export" >"$WORK/ft-export.out" 2>&1
  expect_eq "$?" 0 "... export"
  ids=$("$TT" -c "import struct,sys; d=open(sys.argv[1],'rb').read(); print(','.join(str(i) for i in struct.unpack('<12I', d[:48])))" "$WORK/kjv.txt.ref")
  "$LOCKSTEP" generate --checkpoint "$WORK/runs/ft" --prompt-tokens "$ids" --logits "$WORK/ft.logits" >/dev/null 2>&1
  if out=$("$TT" "$J" logits "$WORK/ft-export" "$WORK/ft.logits" "$ids" 2>&1); then
    pass "... the export in transformers gives lockstep's logits: $out"
  else
    fail "... the export's logits differ: $out"
  fi
  "$LOCKSTEP" generate --checkpoint "$WORK/runs/ft" --prompt "In the beginning" --max-new-tokens 5 >"$WORK/ft-gen.out" 2>&1
  expect_grep "$WORK/ft-gen.out" "^In the beginning" "... and generates text through its tokenizer.json"
else
  echo "note: transformers is absent here: the tokenizer.json part is the pip platform's (scripts/test_pip.sh)"
fi
mkdir -p "$WORK/edited" && sed '1000s/ 999$/ 127999/; 128000s/ 127999$/ 999/' "$model" >"$WORK/edited/tokenizer.model"
"$LOCKSTEP" tokenize "$WORK/edge.bin" --vocab "$WORK/edited" --format llmc --out "$WORK/x3" >"$WORK/x3.out" 2>&1
expect_eq "$?" 2 "a rank file of Llama 3's size that is not Llama 3's: exit 2"
expect_grep "$WORK/x3.out" "edited/tokenizer.model: 128000 ranks, and not Llama 3's tokenizer.model" "it names the file and says why"

# 3. A small Llama on those uint32 files: trains, and generate takes and
#    prints text through the same tokenizer.
"$LOCKSTEP" tokenize "$root/data/kjv.txt" --vocab "$model" --format llmc --out "$WORK/kjv" --val-fraction 0.1 2>/dev/null
"$LOCKSTEP_RUN" --nproc-per-node 2 --master-port 0 "$LOCKSTEP" train --config "$root/configs/llama-tiny.yaml" \
  --set run.dir="$WORK/runs" --set data.path="$WORK/kjv" --set data.vocab_size=128256 --set data.tokenizer="$model" \
  --set model.n_layer=1 --set model.n_embd=32 --set model.intermediate_size=64 --set model.block_size=32 \
  --set data.batch_size=4 --set train.max_steps=4 --set checkpoint.every=4 --set train.eval_batches=2 \
  --set log.progress=plain >"$WORK/train.out" 2>&1
expect_eq "$?" 0 "a Llama trains on Llama 3 tokens (uint32, vocabulary 128,256) on 2 ranks"
"$LOCKSTEP" generate --checkpoint "$WORK/runs/llama-tiny" --prompt "In the beginning" --max-new-tokens 5 >"$WORK/gen.out" 2>&1
expect_eq "$?" 0 "generate from it with --prompt text"
expect_grep "$WORK/gen.out" "^In the beginning" "the output is text, after the prompt"
"$LOCKSTEP" generate --checkpoint "$WORK/runs/llama-tiny" --prompt "<|begin_of_text|>In" --special --logits "$WORK/special.logits" >/dev/null 2>&1
expect_eq "$(stat -c %s "$WORK/special.logits" 2>/dev/null)" "$((2 * 128256 * 4))" "generate --special: '<|begin_of_text|>In' is 2 tokens"

echo "$PASSES passed, $FAILURES failed"
[ "$FAILURES" -eq 0 ]
