#!/usr/bin/env bash
# lockstep's GPT is PyTorch's (docs/models.md): Python's GPT
# (tests/python/gpt.py) makes the initial weights, lockstep trains 50 steps
# from them (model.init_from) on one rank, Python trains the same 50 steps
# on the same batches; the per-step losses and the final weights agree within
# float32 rounding, lockstep's checkpoint loads into Python with strict=True,
# and Python's greedy continuation from it equals `lockstep generate`'s.
source "$(dirname "$0")/lib.sh"
root=$(cd "$(dirname "$0")/../.." && pwd)
text="$root/data/kjv.txt"
[ -f "$text" ] || { fail "$text is missing (scripts/make_text.sh)"; finish; }
head -c 100000 "$text" >"$WORK/text.txt"
shape=(--n_layer 2 --n_head 2 --n_embd 64 --block_size 32 --batch_size 8 --steps 50 --seed 3
       --lr 0.002 --weight_decay 0.1 --clip 1.0 --validation_fraction 0.1)
$PY "$root/tests/python/gpt_parity.py" init "$WORK/init.pt" "${shape[@]}" 2>"$WORK/py.err"
expect_eq "$?" 0 "Python makes the initial weights" || sed 's/^/    /' "$WORK/py.err"
OMP_NUM_THREADS=1 "$LOCKSTEP" train --config "$root/configs/gpt-text.yaml" --set run.dir="$WORK/runs" \
  --set run.name=parity --set data.path="$WORK/text.txt" --set model.n_layer=2 --set model.n_head=2 \
  --set model.n_embd=64 --set model.block_size=32 --set data.batch_size=8 --set train.max_steps=50 \
  --set run.seed=3 --set optim.lr=0.002 --set optim.weight_decay=0.1 --set optim.beta2=0.999 \
  --set optim.schedule=constant --set optim.warmup_steps=0 --set train.clip_grad_norm=1.0 \
  --set log.every=1 --set checkpoint.every=50 --set model.init_from="$WORK/init.pt" >"$WORK/train.out" 2>&1
expect_eq "$?" 0 "lockstep trains 50 steps from them"
expect_grep "$WORK/train.out" "model initialised from $WORK/init.pt" "loading Python's state dict"
ckpt="$WORK/runs/parity/checkpoints/step_00000050"
prompt="And God said, Let"
"$LOCKSTEP" generate --checkpoint "$ckpt" --prompt "$prompt" --temperature 0 --max-new-tokens 40 \
  >"$WORK/generated" 2>"$WORK/gen.err"
expect_eq "$?" 0 "lockstep generate, greedy"
$PY "$root/tests/python/gpt_parity.py" compare "$WORK/init.pt" "${shape[@]}" --text "$WORK/text.txt" \
  --metrics "$WORK/runs/parity/metrics.jsonl" --checkpoint "$ckpt/model.pt" \
  --generated "$WORK/generated" --prompt "$prompt" >"$WORK/parity" 2>"$WORK/py.err"
expect_eq "$?" 0 "Python trains the same 50 steps and loads lockstep's checkpoint with strict=True"
sed 's/^/    /' "$WORK/parity"
[ -s "$WORK/py.err" ] && sed 's/^/    /' "$WORK/py.err" | tail -15
rel=$(sed -n 's/.*largest relative difference \([0-9.e+-]*\).*/\1/p' "$WORK/parity")
# Measured: LibTorch/PyTorch 1.13 bit-identical (the printing's 1.6e-8);
# 2.6 losses within 1.5e-7 and weights within 1.5e-4: PyTorch 2.6's Python
# clipping and attention take other kernels than LibTorch's, and AdamW turns
# a rounding difference in a gradient into up to a fraction of lr (2e-3) per
# step.
expect_lt "${rel:-1}" 1e-5 "per-step losses agree within 1e-5 (relative)"
diff=$(sed -n 's/.*largest difference after 50 steps \([0-9.e+-]*\).*/\1/p' "$WORK/parity")
expect_lt "${diff:-1}" 1e-3 "final weights agree within 1e-3 (half an AdamW step)"
expect_grep "$WORK/parity" "^greedy: equal\$" "Python's greedy continuation equals lockstep generate's"
# safetensors in Hugging Face's GPT-2 layout (Note [GPT-2 layout]), both
# ways, against tests/python/safetensors_io.py (the format from its spec).
ST="$root/tests/python/safetensors_io.py"
zero() {  # zero NAME ARGS...: one step at lr 0 from an init, its weights kept
  local name=$1
  shift
  OMP_NUM_THREADS=1 "$LOCKSTEP" train --config "$root/configs/gpt-text.yaml" --set run.dir="$WORK/runs" \
    --set run.name="$name" --set data.path="$WORK/text.txt" --set model.n_layer=2 --set model.n_head=2 \
    --set model.n_embd=64 --set model.block_size=32 --set data.batch_size=8 --set train.max_steps=1 \
    --set optim.lr=0 --set checkpoint.every=1 --set check.every=0 "$@" >"$WORK/$name.out" 2>&1
}
$PY "$ST" write-hf "$WORK/init.pt" "$WORK/hf.safetensors" >"$WORK/st.out" 2>&1
expect_eq "$?" 0 "Python writes Python's initial GPT as GPT-2's upload (no prefix, Conv1D, mask buffers, lm_head)"
zero fromhf --set model.init_from="$WORK/hf.safetensors"
expect_eq "$?" 0 "lockstep initialises from that model.safetensors"
$PY "$ST" equal "$WORK/runs/fromhf/checkpoints/step_00000001/model.pt" "$WORK/init.pt" >"$WORK/st.out" 2>&1
expect_eq "$?" 0 "with Python's weights bit for bit (lr 0: the step leaves them): $(tail -1 "$WORK/st.out")"
"$LOCKSTEP" export --checkpoint "$ckpt" --out "$WORK/exported" >"$WORK/export.out" 2>&1
expect_eq "$?" 0 "lockstep export --format safetensors (hf layout) of the trained checkpoint"
expect_grep "$WORK/exported/config.json" '"model_type": "gpt2"' "with GPT-2's config.json"
$PY "$ST" compare-hf "$WORK/exported/model.safetensors" "$ckpt/model.pt" >"$WORK/st.out" 2>&1
expect_eq "$?" 0 "Python reads it: GPT2LMHeadModel's names, Conv1D transposed, the same values ($(tail -1 "$WORK/st.out"))"
zero roundtrip --set model.init_from="$WORK/exported/model.safetensors"
$PY "$ST" equal "$WORK/runs/roundtrip/checkpoints/step_00000001/model.pt" "$ckpt/model.pt" >"$WORK/st.out" 2>&1
expect_eq "$?" 0 "export -> init_from is bit-identical (hf layout)"
"$LOCKSTEP" export --checkpoint "$ckpt" --layout lockstep --out "$WORK/own" >"$WORK/export.out" 2>&1
zero roundown --set model.init_from="$WORK/own/model.safetensors"
$PY "$ST" equal "$WORK/runs/roundown/checkpoints/step_00000001/model.pt" "$ckpt/model.pt" >"$WORK/st.out" 2>&1
expect_eq "$?" 0 "and with --layout lockstep"
# Bad input: exit 2, naming the file and the entry.
head -c 1000 "$WORK/exported/model.safetensors" >"$WORK/cut.safetensors"
zero cut --set model.init_from="$WORK/cut.safetensors"
expect_eq "$?" 2 "a truncated safetensors file exits 2"
expect_grep "$WORK/cut.out" "cut.safetensors'.*(header length|outside the data)" "naming the file and what is wrong"
zero wide --set model.init_from="$WORK/hf.safetensors" --set model.n_embd=32
expect_eq "$?" 2 "weights of another shape exit 2"
expect_grep "$WORK/wide.out" "hf.safetensors" "naming the file"
"$LOCKSTEP" export --checkpoint "$ckpt" --out "$WORK/x" --layout onnx >"$WORK/export.out" 2>&1
expect_eq "$?" 2 "an unknown --layout exits 2"
"$LOCKSTEP" export --checkpoint "$ckpt" --out "$WORK/exported" >"$WORK/export.out" 2>&1
expect_eq "$?" 2 "export overwrites nothing: an earlier export's folder exits 2"
expect_grep "$WORK/export.out" "already holds model.safetensors" "saying what is there"
before=$(sha256sum "$ckpt"/* | sha256sum)
"$LOCKSTEP" export --checkpoint "$ckpt" --layout lockstep --out "$ckpt" >"$WORK/export.out" 2>&1
expect_eq "$?" 2 "and a checkpoint folder as --out exits 2"
expect_eq "$(sha256sum "$ckpt"/* | sha256sum)" "$before" "leaving the checkpoint as it was"
finish
