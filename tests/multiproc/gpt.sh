#!/usr/bin/env bash
# The GPT workload end to end (docs/models.md): two ranks train a small GPT
# on 200 KB of the demo's text (data.name: text) with the weights checked
# every step, and on nanoGPT-style token files (data.name: tokens);
# `lockstep generate` samples from the run, deterministically for a seed,
# and names every bad request (exit 2).
source "$(dirname "$0")/lib.sh"
root=$(cd "$(dirname "$0")/../.." && pwd)
text="$root/data/kjv.txt"
[ -f "$text" ] || { fail "$text is missing (scripts/make_text.sh makes it; scripts/setup.sh runs that)"; finish; }
head -c 200000 "$text" >"$WORK/kjv-head.txt"
small=(--set model.n_layer=2 --set model.n_head=2 --set model.n_embd=64 --set model.block_size=64
       --set data.batch_size=8 --set train.max_steps=30 --set checkpoint.every=15 --set log.every=10
       --set optim.warmup_steps=5)
"$LOCKSTEP_RUN" --nproc-per-node 2 --master-port 0 "$LOCKSTEP" train --config "$root/configs/gpt-text.yaml" \
  --set run.dir="$WORK/runs" --set data.path="$WORK/kjv-head.txt" "${small[@]}" >"$WORK/train.out" 2>&1
expect_eq "$?" 0 "2 ranks train a GPT on text, weights checked every step"
expect_grep "$WORK/train.out" "data: text \(200,000 bytes of .*kjv-head.txt, the last 20,000 held out for validation" "the text is read as bytes, its tail held out"
expect_grep "$WORK/train.out" "\[rank0\]: .*model: gpt with [0-9]+ parameters" "the model is a gpt"
expect_grep "$WORK/train.out" "validation: loss [0-3]\.[0-9]+" "validation loss under 4 nats/byte after 30 steps (ln(256) = 5.5 at the start)"
run="$WORK/runs/gpt-text"
# lockstep eval on the GPT: perplexity = exp(loss), and the figures are the
# trainer's last evaluation of the same weights (2 ranks there, 2 here).
"$LOCKSTEP_RUN" --nproc-per-node 2 --master-port 0 "$LOCKSTEP" eval --checkpoint "$run" \
  --output "$WORK/eval.json" >"$WORK/eval.out" 2>&1
expect_eq "$?" 0 "lockstep eval on the GPT's checkpoint, 2 ranks"
$PY - "$WORK/eval.json" "$run/metrics.jsonl" <<'PY' >"$WORK/eval.check" 2>&1
import json, math, sys
e = json.load(open(sys.argv[1]))
val = [json.loads(l) for l in open(sys.argv[2]) if '"val_loss"' in l][-1]
assert e["step"] == 30 and e["examples"] == val.get("val_examples", e["examples"]), (e, val)
assert abs(e["perplexity"] - math.exp(e["loss"])) < 1e-6 * e["perplexity"], e
assert abs(e["loss"] - val["val_loss"]) < 2e-6, (e["loss"], val["val_loss"])
assert abs(e["accuracy"] - val["val_accuracy"]) < 2e-6, (e["accuracy"], val["val_accuracy"])
print("loss", e["loss"], "perplexity", e["perplexity"])
PY
expect_eq "$?" 0 "its loss, next-token accuracy and perplexity are the trainer's ($(tail -1 "$WORK/eval.check"))"

# model.activation_checkpointing (Note [Activation checkpointing]): 2 ranks,
# dropout on, DDP, AdamW and clipping: the same weights bit for bit as
# without it (the memory it saves: docs/zero.md).
ckpt=(--set model.n_layer=4 --set model.n_head=2 --set model.n_embd=64 --set model.block_size=64
      --set data.batch_size=8 --set train.max_steps=12 --set checkpoint.every=0 --set log.every=6
      --set model.dropout=0.1 --set optim.warmup_steps=2 --set data.path="$WORK/kjv-head.txt")
for ac in false true; do
  "$LOCKSTEP_RUN" --nproc-per-node 2 --master-port 0 "$LOCKSTEP" train --config "$root/configs/gpt-text.yaml" \
    --set run.dir="$WORK/runs" --set run.name=ac-$ac "${ckpt[@]}" --set model.activation_checkpointing=$ac \
    >"$WORK/ac-$ac.out" 2>&1
  expect_eq "$?" 0 "GPT with model.activation_checkpointing=$ac"
done
wa=$(sed -n 's/.*trained .* weights \([0-9a-f]*\);.*/\1/p' "$WORK/ac-false.out")
wb=$(sed -n 's/.*trained .* weights \([0-9a-f]*\);.*/\1/p' "$WORK/ac-true.out")
expect_eq "${wb:-none}" "${wa:-missing}" "activation checkpointing ends bit-identical to the plain run (dropout 0.1, 2 ranks)"

gen() { "$LOCKSTEP" generate --checkpoint "$@"; }
gen "$run" --prompt "In the beginning" --max-new-tokens 60 --seed 3 >"$WORK/g1" 2>"$WORK/g1.err"
expect_eq "$?" 0 "generate from the run folder (its newest checkpoint)"
expect_grep "$WORK/g1" "^In the beginning" "the output starts with the prompt"
[ "$(wc -c <"$WORK/g1")" -ge $((16 + 60 + 1)) ] && pass "and 60 bytes drawn after it (U+FFFD, 3 bytes, for any that are no UTF-8)" || fail "output too short: $(cat "$WORK/g1")"
gen "$run/checkpoints/step_00000030" --prompt "In the beginning" --max-new-tokens 60 --seed 3 >"$WORK/g2" 2>"$WORK/g2.err"
cmp -s "$WORK/g1" "$WORK/g2" && pass "the same seed draws the same text (and the folder = the run's newest)" || fail "two draws with seed 3 differ"
gen "$run" --prompt "In the beginning" --max-new-tokens 60 --seed 4 >"$WORK/g3" 2>"$WORK/g3.err"
cmp -s "$WORK/g1" "$WORK/g3" && fail "seeds 3 and 4 drew the same text" || pass "another seed draws another text"

# Bad requests: exit 2, saying what is wrong.
bad() {  # bad WHAT PATTERN ARGS...
  local what=$1 pattern=$2
  shift 2
  "$LOCKSTEP" generate "$@" >"$WORK/bad.out" 2>&1
  expect_eq "$?" 2 "$what: exit 2"
  expect_grep "$WORK/bad.out" "$pattern" "$what: says so"
}
bad "an empty prompt" "--prompt is empty" --checkpoint "$run" --prompt ""
bad "a prompt longer than the context" "the prompt is 65 tokens, longer than the model's context of model.block_size=64" \
  --checkpoint "$run" --prompt "$(printf 'a%.0s' $(seq 65))"
bad "token ids for a byte model" "this model reads bytes" --checkpoint "$run" --prompt-tokens 1,2
bad "a path that is no checkpoint" "neither a checkpoint folder .* nor a run folder" --checkpoint "$WORK"
"$LOCKSTEP" train --config "$root/configs/digits.yaml" --set run.dir="$WORK/runs" --set train.max_steps=3 \
  >"$WORK/mlp.out" 2>&1
bad "a checkpoint of another model" "holds a mlp model: lockstep generate samples from model.name: gpt" \
  --checkpoint "$WORK/runs/digits"
cp -r "$run/checkpoints/step_00000030" "$WORK/corrupt"
printf 'x' | dd of="$WORK/corrupt/model.pt" bs=1 seek=100 conv=notrunc status=none
bad "a corrupted checkpoint" "model.pt's SHA-256 does not match its MANIFEST" --checkpoint "$WORK/corrupt"

# nanoGPT's format: uint16 train.bin and val.bin in a folder; ids in, ids out.
$PY - "$WORK/tok" <<'PY'
import os, struct, sys
os.makedirs(sys.argv[1])
seq = [i % 37 for i in range(20000)]
for name, part in (("train.bin", seq[:18000]), ("val.bin", seq[18000:])):
    open(os.path.join(sys.argv[1], name), "wb").write(struct.pack("<%dH" % len(part), *part))
PY
"$LOCKSTEP_RUN" --nproc-per-node 2 --master-port 0 "$LOCKSTEP" train --config "$root/configs/gpt-text.yaml" \
  --set run.dir="$WORK/runs" --set run.name=tokens --set data.name=tokens --set data.path="$WORK/tok" \
  --set data.vocab_size=37 "${small[@]}" >"$WORK/tok.out" 2>&1
expect_eq "$?" 0 "2 ranks train on nanoGPT's train.bin/val.bin"
expect_grep "$WORK/tok.out" "18,000 tokens in .*train.bin, 2,000 in .*val.bin" "val.bin beside train.bin validates"
gen "$WORK/runs/tokens" --prompt-tokens 1,2,3 --max-new-tokens 5 --temperature 0 >"$WORK/ids" 2>&1
expect_grep "$WORK/ids" "^1 2 3( [0-9]+){5}\$" "a model of token ids takes and prints ids"
bad "text for a model of token ids" "trained on token ids \(data.name: tokens\) without data.tokenizer" --checkpoint "$WORK/runs/tokens" --prompt "hi"
finish
