#!/usr/bin/env bash
# model.name: llama (model/llama.h) against transformers' LlamaForCausalLM
# (tests/python/llama_parity.py; the pip platform's Python has
# transformers, elsewhere that part says SKIP):
# 1. a random LlamaForCausalLM with grouped-query attention, saved by
#    save_pretrained in several shards with an index: lockstep reads the
#    folder (model.init_from's reader) and gives transformers' logits
#    within 1e-5;
# 2. 20 training steps from that folder, lockstep's and transformers' on the
#    same batches, AdamW and clipping: per-step losses within 1e-5
#    (relative);
# 3. `lockstep export` of the trained checkpoint loads into transformers
#    (from_pretrained) with lockstep's logits within 1e-5; the same for
#    Llama 3.1's rope scaling, read from and written to config.json;
# 4. greedy generation: `lockstep generate` equals transformers' generate();
# Everywhere: 2 ranks under ZeRO-3 end with the weights of 2 ranks under
# DDP, activation checkpointing changes no weight, configs/llama-tiny.yaml
# (on bytes) trains on 2 ranks with sharded checkpoints, resumes on 3 and
# generates; with transformers, a config.json that describes another model
# is exit 2 naming the field and the key.
#   llama.sh LOCKSTEP LOCKSTEP_RUN LOCKSTEP_TESTS
source "$(dirname "$0")/lib.sh"
TESTS=${3:?usage: $0 LOCKSTEP LOCKSTEP_RUN LOCKSTEP_TESTS}
root=$(cd "$(dirname "$0")/../.." && pwd)
export OMP_NUM_THREADS=1
text="$root/data/kjv.txt"
[ -f "$text" ] || { fail "$text is missing (scripts/make_text.sh)"; finish; }
head -c 100000 "$text" >"$WORK/text.txt"
SHAPE=(--set model.name=llama --set model.n_layer=2 --set model.n_head=4 --set model.n_kv_head=2
       --set model.n_embd=64 --set model.intermediate_size=160 --set model.block_size=32
       --set data.path="$WORK/text.txt" --set data.batch_size=8 --set data.validation_fraction=0.1)
TRAIN_ARGS=(--config "$root/configs/gpt-text.yaml" "${SHAPE[@]}" --set checkpoint.every=0
            --set train.max_steps=10)

# Everywhere: ZeRO-3 and activation checkpointing change no bit.
train ddp 2
train z3 2 --set optim.zero=3
same z3 ddp "2 ranks, ZeRO-3 (each decoder layer a unit): the DDP run's weights"
train recompute 2 --set model.activation_checkpointing=true
same recompute ddp "activation checkpointing: the same weights"
expect_grep "$WORK/ddp.out" "model: llama with" "the model is built"
# configs/llama-tiny.yaml on bytes (its BPE tokens need the GPT-2 vocabulary):
# 2 ranks, ZeRO-3, sharded checkpoints; resumed on 3 ranks; generate.
TINY=(--config "$root/configs/llama-tiny.yaml" --set data.name=text --set data.path="$WORK/text.txt"
      --set data.tokenizer= --set data.vocab_size=0 --set checkpoint.every=10)
TRAIN_ARGS=()
train tiny 2 "${TINY[@]}" --set train.max_steps=20
expect_eq "$?" 0 "configs/llama-tiny.yaml: 2 ranks, ZeRO-3, sharded checkpoints"
expect_grep "$WORK/tiny.out" "step_00000020 \(sharded\)" "... a sharded checkpoint at step 20"
APPEND=1 train tiny 3 "${TINY[@]}" --set train.max_steps=30 --set checkpoint.resume=auto
expect_eq "$?" 0 "... resumed on 3 ranks"
expect_grep "$WORK/tiny.out" "resumed from .*step_00000020 at step 20.*written by 2 rank\(s\).*now 3" \
  "... from step 20, written by 2 ranks"
"$LOCKSTEP" generate --checkpoint "$RUNS/tiny" --prompt "In the beginning" --max-new-tokens 20 \
  >"$WORK/tiny.gen" 2>&1
expect_eq "$?" 0 "... and generates"
expect_grep "$WORK/tiny.gen" "^In the beginning" "... continuing the prompt"
TRAIN_ARGS=(--config "$root/configs/gpt-text.yaml" "${SHAPE[@]}" --set checkpoint.every=0
            --set train.max_steps=10)

if ! "$PY" -c 'import transformers' 2>/dev/null; then
  echo "SKIP: $PY lacks transformers (the pip platform's environment has it: scripts/test_pip.sh)"
  [ "$FAILURES" -eq 0 ] && exit 77
  finish
fi
# 1. Logits of a save_pretrained folder.
P="$root/tests/python/llama_parity.py"
$PY "$P" init "$WORK" >"$WORK/init.out" 2>&1 || { fail "transformers makes the model"; tail "$WORK/init.out"; finish; }
shards=$(ls "$WORK/hf" | grep -c '^model-.*\.safetensors$')
expect_lt 1 "$shards" "save_pretrained wrote the weights in several shards with an index"
logits() {  # logits FOLDER NAME: transformers' and lockstep's, compared
  $PY "$P" logits "$1" "$WORK/ids.pt" "$WORK/$2_ref.pt" >/dev/null 2>&1
  LOCKSTEP_LLAMA_FOLDER="$1" LOCKSTEP_LLAMA_IDS="$WORK/ids.pt" LOCKSTEP_LLAMA_OUT="$WORK/$2_ours.pt" \
    "$TESTS" "[.llama_logits]" >"$WORK/$2.log" 2>&1 || { tail "$WORK/$2.log"; }
  local out
  if out=$($PY "$P" close "$WORK/$2_ours.pt" "$WORK/$2_ref.pt" 1e-5 2>&1); then pass "$2: $out"; else fail "$2: $out"; fi
}
logits "$WORK/hf" "transformers' folder"

# Llama 3.1's rope scaling (transformers 5's rope_parameters), read, and
# written back by export (the Hub's rope_scaling form) for transformers.
ROPE=(--set model.rope_scaling=llama3 --set model.rope_factor=8 --set model.rope_low_freq_factor=1
      --set model.rope_high_freq_factor=4 --set model.rope_original_max_position_embeddings=64)
$PY "$P" init "$WORK/scaled" llama3 >"$WORK/init-scaled.out" 2>&1 || fail "transformers makes the scaled model"
logits "$WORK/scaled/hf" "Llama 3.1's rope scaling"
"$LOCKSTEP" train "${TRAIN_ARGS[@]}" "${ROPE[@]}" --set run.dir="$RUNS" --set run.name=scaled \
  --set optim.lr=0 --set train.max_steps=1 --set checkpoint.every=1 --set model.init_from="$WORK/scaled/hf" \
  >"$WORK/scaled.out" 2>&1
expect_eq "$?" 0 "lockstep reads the scaled folder with model.rope_scaling llama3"
"$LOCKSTEP" export --checkpoint "$RUNS/scaled/checkpoints/step_00000001" --out "$WORK/scaled-export" >/dev/null 2>&1
expect_grep "$WORK/scaled-export/config.json" '"rope_scaling": \{"rope_type": "llama3", "factor": 8' "export writes the scaling"
logits "$WORK/scaled-export" "the scaled export, through transformers"
"$LOCKSTEP" train "${TRAIN_ARGS[@]}" --set run.dir="$RUNS" --set run.name=unscaled \
  --set model.init_from="$WORK/scaled/hf" >"$WORK/unscaled.out" 2>&1
expect_eq "$?" 2 "the scaled folder without model.rope_scaling: exit 2"
expect_grep "$WORK/unscaled.out" "rope_parameters.rope_type is llama3, but model.rope_scaling is none \(--set model.rope_scaling=llama3\)" \
  "naming the field and the key"

# 2. Training, step for step.
OPT=(--set run.seed=3 --set optim.lr=0.002 --set optim.weight_decay=0.1 --set optim.beta2=0.999
     --set optim.schedule=constant --set optim.warmup_steps=0 --set train.clip_grad_norm=1.0
     --set log.every=1)
"$LOCKSTEP" train "${TRAIN_ARGS[@]}" "${OPT[@]}" --set run.dir="$RUNS" --set run.name=parity \
  --set train.max_steps=20 --set checkpoint.every=20 --set model.init_from="$WORK/hf" >"$WORK/parity.out" 2>&1
expect_eq "$?" 0 "lockstep trains 20 steps from the folder"
if out=$($PY "$P" train "$WORK" --text "$WORK/text.txt" --metrics "$RUNS/parity/metrics.jsonl" \
  --steps 20 --batch 8 --block 32 --seed 3 2>/dev/null); then
  rel=$(echo "$out" | sed -n 's/.*largest relative difference \([0-9.e+-]*\).*/\1/p')
  expect_lt "${rel:-1}" 1e-5 "transformers' per-step losses: $out"
else
  fail "transformers' training: $out"
fi

# 3. The export, read by transformers.
"$LOCKSTEP" export --checkpoint "$RUNS/parity/checkpoints/step_00000020" --out "$WORK/export" >"$WORK/export.out" 2>&1
expect_eq "$?" 0 "lockstep export writes a Hugging Face folder"
logits "$WORK/export" "lockstep's export"

# 4. Greedy generation, lockstep's and transformers' (the prompt and the
#    tokens within the 32-token context: transformers does not crop).
prompt="And God said, Let"
"$LOCKSTEP" generate --checkpoint "$RUNS/parity/checkpoints/step_00000020" --prompt "$prompt" \
  --temperature 0 --max-new-tokens 15 >"$WORK/generated" 2>"$WORK/gen.err"
expect_eq "$?" 0 "lockstep generate from the Llama, greedy"
if out=$($PY "$P" greedy "$WORK/export" "$prompt" 15 "$WORK/generated" 2>/dev/null); then
  pass "transformers' generate(): $out"
else
  fail "transformers' generate(): $out"
fi

# A config.json of another shape: exit 2, the field and the key named.
"$LOCKSTEP" train "${TRAIN_ARGS[@]}" --set run.dir="$RUNS" --set run.name=deeper --set model.n_layer=3 \
  --set model.init_from="$WORK/hf" >"$WORK/deeper.out" 2>&1
expect_eq "$?" 2 "a folder of 2 layers into model.n_layer 3: exit 2"
expect_grep "$WORK/deeper.out" "num_hidden_layers is 2, but model.n_layer is 3 \(--set model.n_layer=2\)" \
  "naming the field and the key"
finish
