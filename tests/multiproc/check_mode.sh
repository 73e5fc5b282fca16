#!/usr/bin/env bash
# `lockstep check --config`: a healthy setup exits 0 with the report; each
# injected fault exits 1 naming the step, the parameter and the rank.
source "$(dirname "$0")/lib.sh"
root=$(cd "$(dirname "$0")/../.." && pwd)
check() {  # check NPROC ARGS...
  local n=$1
  shift
  "$LOCKSTEP_RUN" --nproc-per-node "$n" --master-port 0 "$LOCKSTEP" check \
    --config "$root/configs/digits.yaml" --steps 4 "$@" >"$WORK/out" 2>"$WORK/err"
}

for n in 2 3; do
  check $n
  expect_eq "$?" 0 "healthy setup on $n ranks exits 0"
  expect_grep "$WORK/out" "^\[rank0\]: \(a\) communication self-check +PASS" "(a) passes on $n ranks"
  expect_grep "$WORK/out" "^\[rank0\]: \(b\) DDP training, 4 steps +PASS \(identical after every step\)" "(b) passes on $n ranks"
  expect_grep "$WORK/out" "^\[rank0\]: \(c\) negative control, no sync +PASS \(divergence caught at step 1: .*first differing tensor 'layers.0.weight'" "(c) caught at step 1 on $n ranks"
  expect_grep "$WORK/out" "^\[rank0\]: +4( +[0-9a-f]{16}){$n} +same\$" "per-rank digests of step 4 on $n ranks"
done

# (b) runs the trainer's own step: with accumulation, clipping and a schedule
# its weights are those of `lockstep train` stopped after as many steps.
# A schedule longer than the 25 steps checked: train's max_steps would
# otherwise end it at step 25, check's config runs the epochs' length.
same=(--set train.accumulation_steps=2 --set train.clip_grad_norm=0.5 --set optim.schedule=cosine --set optim.warmup_steps=2 --set model.dropout=0.1
  --set optim.decay_steps=60)
check 2 --steps 25 "${same[@]}"
expect_eq "$?" 0 "check with accumulation, clipping and a schedule passes"
checked=$(sed -n 's/.*(b).s final weights \([0-9a-f]*\) .*/\1/p' "$WORK/out")
"$LOCKSTEP_RUN" --nproc-per-node 2 --master-port 0 "$LOCKSTEP" train \
  --config "$root/configs/digits.yaml" --set train.max_steps=25 --set run.dir="$WORK/runs" \
  --set checkpoint.every=0 "${same[@]}" >"$WORK/train_out" 2>"$WORK/train_err"
expect_eq "$?" 0 "the same config trains"
trained=$(sed -n 's/.*weights \([0-9a-f]*\); run .*/\1/p' "$WORK/train_out")
expect_eq "${checked:-none}" "${trained:-missing}" "check mode's weights equal lockstep train's after 25 steps (two epochs and a half)"

# The same with ZeRO-2 and bf16 (Note [One run assembly]): check mode builds
# the ZeroOptimizer and its reduce-scatter as train does; it used to run a
# plain optimizer and end elsewhere.
zero=(--set optim.zero=2 --set train.precision=bf16 --set optim.name=adam --set optim.lr=0.01 "${same[@]}")
check 2 --steps 10 "${zero[@]}"
expect_eq "$?" 0 "check with optim.zero 2 and bf16 passes (its negative control runs unsharded)"
expect_grep "$WORK/out" "^\[rank0\]: run: optim adam, optim.zero 2 \(the negative control unsharded.*precision bf16, accumulation 2" "and says it ran ZeRO-2 with bf16"
checked=$(sed -n 's/.*(b).s final weights \([0-9a-f]*\) .*/\1/p' "$WORK/out")
"$LOCKSTEP_RUN" --nproc-per-node 2 --master-port 0 "$LOCKSTEP" train \
  --config "$root/configs/digits.yaml" --set train.max_steps=10 --set run.dir="$WORK/runs" \
  --set run.name=zero2 --set checkpoint.every=0 "${zero[@]}" >"$WORK/train_out" 2>"$WORK/train_err"
expect_eq "$?" 0 "the same config trains"
trained=$(sed -n 's/.*weights \([0-9a-f]*\); run .*/\1/p' "$WORK/train_out")
expect_eq "${checked:-none}" "${trained:-missing}" "check mode's weights equal lockstep train's with optim.zero 2 and bf16"

check 3 --inject lr --fault-rank 1
expect_eq "$?" 1 "a rank with another learning rate exits 1"
expect_grep "$WORK/out" "\(b\) DDP training, 4 steps +FAIL: weights differ across ranks after step 1: first differing tensor 'layers.0.weight'; rank\(s\) 0, 2 hold [0-9a-f]+; rank\(s\) 1 hold" "names step 1, the tensor and rank 1"

check 2 --inject init
expect_eq "$?" 1 "an unseeded re-initialisation exits 1"
expect_grep "$WORK/out" "after step 1: first differing tensor 'layers.0.weight'; rank\(s\) 0 hold [0-9a-f]+; rank\(s\) 1 hold" "names the re-initialised layer and rank 1"

check 2 --inject no-buffer-broadcast --set model.name=cnn --set model.batch_norm=true --set model.hidden=8
expect_eq "$?" 1 "BatchNorm statistics without buffer broadcast exit 1"
expect_grep "$WORK/out" "first differing tensor 'buffer features.1.running_mean'" "names the BatchNorm buffer"

check 2 --inject no-buffer-broadcast
expect_eq "$?" 2 "no-buffer-broadcast on a model without buffers is bad input"
expect_grep "$WORK/err" "needs a model with buffers" "and says which model to use"

# The check mode validates as train does (config_load_validated): a run
# train refuses is refused here too, exit 2 before any rank starts
# (before: exit 4, a PASS, or a hook dropped silently).
refused() {  # refused WHAT PATTERN ARGS...
  local what=$1 pattern=$2
  shift 2
  "$LOCKSTEP" check --config "$root/configs/digits.yaml" --steps 2 "$@" >"$WORK/out" 2>"$WORK/err"
  expect_eq "$?" 2 "check --config refuses $what with exit 2"
  expect_grep "$WORK/err" "$pattern" "saying what train says"
  "$LOCKSTEP" train --config "$root/configs/digits.yaml" "$@" --set run.dir="$WORK/runs" >"$WORK/tout" 2>&1
  expect_eq "$?" 2 "train refuses $what too"
}
refused "a GPT on the digits" "model.name: gpt is a language model" --set model.name=gpt
refused "checkpoint.async without the sharded format" "checkpoint.async .* needs checkpoint.format: sharded" --set checkpoint.async=true
refused "optim.zero 2 with a comm hook" "optim.zero: 2 exchanges the gradients by reduce-scatter" --set optim.zero=2 --set ddp.comm_hook=fp16
refused "a watched validation metric with no validation split" "checkpoint.keep_best watches a validation metric, but the validation split is empty" --set data.validation_fraction=0 --set checkpoint.keep_best=val_loss
start=$(now)
"$LOCKSTEP_RUN" --nproc-per-node 2 --master-port 0 "$LOCKSTEP" check --config "$root/configs/digits.yaml" \
  --set optim.zero=2 --set ddp.comm_hook=fp16 >"$WORK/out" 2>"$WORK/err"
expect_eq "$?" 2 "on 2 ranks under lockstep-run too"
grep -q "rendezvous\|process group" "$WORK/out" "$WORK/err" && fail "a rank reached the rendezvous" ||
  pass "no rank reached the rendezvous ($(elapsed "$start") s)"

finish
