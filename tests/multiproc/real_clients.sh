#!/usr/bin/env bash
# The libraries users trust read what lockstep writes, and lockstep reads
# what they write (tests/python/real_clients.py):
# 1. transformers: GPT2LMHeadModel.from_pretrained on `lockstep export`'s
#    folder gives lockstep's logits (`generate --logits`) within 1e-5, and
#    its greedy generate() lockstep's `generate --temperature 0`;
# 2. transformers: a random GPT2LMHeadModel (exact GELU) saved by
#    save_pretrained, read by model.init_from: the same logits;
# 3. safetensors: load_file/safe_open read lockstep's files of every dtype
#    lockstep supports, and lockstep reads save_file's;
# 4. TensorBoard: its own EventAccumulator reads lockstep's event file,
#    every scalar and step equal to metrics.jsonl's.
# The Python is the platform's peer (LOCKSTEP_PYTHON: pip's torch 2.15 with
# transformers, safetensors and tensorboard); where a client is missing the
# test says SKIP and which (exit 77).
source "$(dirname "$0")/lib.sh"
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "$(dirname "$LOCKSTEP")" && pwd)
tests_bin="$build/tests/lockstep_tests"
missing=$("$PY" - <<'PY'
import importlib.util
print(" ".join(m for m in ("transformers", "safetensors", "tensorboard", "numpy")
               if importlib.util.find_spec(m) is None))
PY
)
if [ -n "$missing" ]; then
  echo "SKIP: $PY lacks $missing (the real clients are in the pip platform's environment: scripts/test_pip.sh)"
  exit 77
fi
[ -f "$build/share/lockstep/gpt2/gpt2.tiktoken" ] ||
  { echo "SKIP: GPT-2's ranks are not installed (scripts/fetch_gpt2_vocab.sh)"; exit 77; }
judge() { "$PY" "$root/tests/python/real_clients.py" "$@"; }

# A small GPT on GPT-2 tokens of the KJV.
head -c 300000 "$root/data/kjv.txt" >"$WORK/kjv.txt"
"$LOCKSTEP" tokenize "$WORK/kjv.txt" --out "$WORK/tok" --val-fraction 0.1 >/dev/null 2>&1
shape=(--set model.name=gpt --set model.n_layer=2 --set model.n_head=2 --set model.n_embd=32
  --set model.block_size=32 --set model.bias=true --set model.dropout=0 --set data.name=tokens
  --set data.path="$WORK/tok" --set data.tokenizer=gpt2 --set data.vocab_size=50257 --set data.batch_size=8 --set run.dir="$WORK/runs")
"$LOCKSTEP" train "${shape[@]}" --set run.name=trained --set train.max_steps=30 --set checkpoint.every=30 \
  --set log.every=5 --set train.eval_every=10 --set log.tensorboard=true >"$WORK/train.out" 2>&1
expect_eq "$?" 0 "a GPT trains 30 steps on GPT-2 tokens"
ids="818,262,3726,373,262,8234,11,290,262,8234,373,351,1793,13"   # "In the beginning was the Word, ..."

# 1. Export, logits, greedy.
"$LOCKSTEP" export --checkpoint "$WORK/runs/trained" --out "$WORK/hf" >"$WORK/export.out" 2>&1
expect_eq "$?" 0 "lockstep export (Hugging Face layout)"
"$LOCKSTEP" generate --checkpoint "$WORK/runs/trained" --prompt-tokens "$ids" --logits "$WORK/logits.bin" \
  >"$WORK/gen.out" 2>&1
expect_eq "$?" 0 "lockstep generate --logits"
judge hf-logits "$WORK/hf" "$WORK/logits.bin" "$ids" >"$WORK/judge1" 2>&1
expect_eq "$?" 0 "GPT2LMHeadModel.from_pretrained on the export: lockstep's logits within 1e-5: $(tail -1 "$WORK/judge1")"
"$LOCKSTEP" generate --checkpoint "$WORK/runs/trained" --prompt-tokens "$ids" --temperature 0 \
  --max-new-tokens 16 >"$WORK/greedy" 2>"$WORK/greedy.err"
judge hf-greedy "$WORK/hf" "$ids" 16 "$WORK/greedy" >"$WORK/judge2" 2>&1
expect_eq "$?" 0 "transformers' generate(do_sample=False) equals lockstep generate --temperature 0: $(tail -1 "$WORK/judge2")"

# 2. A random GPT2LMHeadModel from save_pretrained, through model.init_from
#    (one step at lr 0: the checkpoint holds the weights as read).
judge hf-random "$WORK/random" 2 2 32 32 50257 >"$WORK/judge3" 2>&1
expect_eq "$?" 0 "transformers saves a random GPT2LMHeadModel: $(tail -1 "$WORK/judge3")"
"$LOCKSTEP" train "${shape[@]}" --set run.name=from-hf --set model.init_from="$WORK/random/model.safetensors" \
  --set optim.lr=0 --set train.max_steps=1 --set checkpoint.every=1 >"$WORK/from.out" 2>&1
expect_eq "$?" 0 "lockstep reads it as model.init_from"
"$LOCKSTEP" generate --checkpoint "$WORK/runs/from-hf" --prompt-tokens "$ids" --logits "$WORK/logits2.bin" \
  >/dev/null 2>&1
judge hf-compare "$WORK/random" "$WORK/logits2.bin" "$ids" >"$WORK/judge4" 2>&1
expect_eq "$?" 0 "the same logits as transformers' own model: $(tail -1 "$WORK/judge4")"

# 3. safetensors, both ways, every dtype.
judge st-write "$WORK/st" >"$WORK/judge5" 2>&1
expect_eq "$?" 0 "safetensors' save_file writes every dtype"
LOCKSTEP_INTEROP_DIR="$WORK/st" "$tests_bin" "[.interop_safetensors]" >"$WORK/st.out" 2>&1
expect_eq "$?" 0 "lockstep reads save_file's files, every value and dtype, and writes its own" ||
  tail -20 "$WORK/st.out"
judge st-read "$WORK/st" >"$WORK/judge6" 2>&1
expect_eq "$?" 0 "safetensors reads lockstep's: $(tail -1 "$WORK/judge6")"

# 4. TensorBoard's own reader.
events=$(ls "$WORK/runs/trained"/events.out.tfevents.* 2>/dev/null | head -1)
judge tb "$events" "$WORK/runs/trained/metrics.jsonl" >"$WORK/judge7" 2>&1
expect_eq "$?" 0 "TensorBoard's EventAccumulator: $(tail -1 "$WORK/judge7")"
finish
