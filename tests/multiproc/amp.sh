#!/usr/bin/env bash
# train.precision end to end on 2 ranks (docs/training.md, Note [Mixed
# precision]): bf16 and fp16 train the digits to within 0.01 of fp32's
# validation accuracy where the LibTorch supports them, and fp16 is refused
# with exit 2 and the reason where it does not (CPU before 2.4); the loss
# scale is in metrics.jsonl; a run with the GradScaler resumes bit-identical
# to an uninterrupted one, its scale and growth tracker restored from
# state.yaml; a checkpoint without a scaler's state is refused for an fp16
# resume; the comm hooks compress scaled gradients; a small GPT in bf16 ends
# near fp32's validation loss; the consistency-check mode passes under
# autocast.
source "$(dirname "$0")/lib.sh"
root=$(cd "$(dirname "$0")/../.." && pwd)
runs=$RUNS
TRAIN_ARGS=(--set log.every=5)
export OMP_NUM_THREADS=1
accuracy() { sed -n 's/.*trained .* validation accuracy \([0-9.]*\),.*/\1/p' "$WORK/run.out"; }

fp16_ok=1
if ! "$LOCKSTEP" train --set train.precision=fp16 --set train.max_steps=1 --set run.dir="$runs" \
  --set run.name=probe --set log.progress=plain >"$WORK/probe" 2>&1; then
  fp16_ok=0
fi

# 0. Precision that knows the CPU (Note [Precision that knows the CPU]):
#    auto picks by a probe and says which, every rank alike; bf16 on a CPU
#    whose bf16 products are slower than fp32's is warned of. oneDNN capped
#    at AVX512_CORE has no native bf16 (emulated: 0.65-0.68x of fp32 on an
#    AMD EPYC with avx512_bf16; an AVX2-only CPU is slower still natively), which makes that CPU.
train run 2 --set run.name=auto --set train.precision=auto --set train.max_steps=3
expect_eq "$?" 0 "train.precision: auto trains"
line=$(grep -o "train.precision: auto chose [a-z0-9]*: .* (\([0-9.]*\)x" "$WORK/run.out" | head -1)
chose=$(echo "$line" | sed -n 's/.*auto chose \([a-z0-9]*\):.*/\1/p')
ratio=$(echo "$line" | sed -n 's/.*(\([0-9.]*\)x$/\1/p')
want=$(awk -v r="$ratio" 'BEGIN{print (r != "" && r >= 1.2) ? "bf16" : "fp32"}')
expect_eq "${chose:-none}" "$want" "auto chose by the measured ratio ($ratio: $want)"
if [ "$want" = bf16 ]; then
  expect_eq "$(grep -c "precision: bf16 autocast on cpu" "$WORK/run.out")" 2 "and both ranks run bf16"
else
  expect_eq "$(grep -c "precision: bf16 autocast" "$WORK/run.out")" 0 "and no rank runs bf16"
fi
expect_grep "$runs/auto/config.yaml" "^  precision: \"$want\"\$" "the saved config holds the precision that ran"
ONEDNN_MAX_CPU_ISA=AVX512_CORE train run 2 --set run.name=slowbf --set train.precision=bf16 --set train.max_steps=3
expect_eq "$?" 0 "bf16 on a CPU without native bf16 trains"
expect_grep "$WORK/run.out" "\[warning\] train.precision: bf16 is slower than fp32 here: this CPU's bf16 products ran at [0-9.]+ GFLOP/s against [0-9.]+ in fp32 \(0\.[0-9]+x, 384\^3; .*set train.precision: fp32 \(or auto" "and is warned of, with the ratio and the flag"
expect_eq "$(grep -c "bf16 is slower than fp32" "$WORK/run.out")" 1 "once (rank 0)"
ONEDNN_MAX_CPU_ISA=AVX512_CORE train run 2 --set run.name=slowauto --set train.precision=auto --set train.max_steps=3
expect_grep "$WORK/run.out" "train.precision: auto chose fp32: this CPU's bf16 products ran at .*\(0\.[0-9]+x" "where bf16 is slower, auto picks fp32"

# 1. Accuracy: 10 epochs of the digits in each precision.
common=(--set train.epochs=10 --set checkpoint.every=0)
train run 2 "${common[@]}" --set run.name=fp32
expect_eq "$?" 0 "fp32 trains"
fp32=$(accuracy)
train run 2 "${common[@]}" --set run.name=bf16 --set train.precision=bf16
expect_eq "$?" 0 "bf16 trains"
expect_grep "$WORK/run.out" "precision: bf16 autocast on cpu" "bf16 says what it does"
bf16=$(accuracy)
expect_lt "$(awk "BEGIN{d=$fp32-${bf16:-0}; print d<0?-d:d}")" 0.01 "bf16 accuracy $bf16 within 0.01 of fp32's $fp32"
grep -q loss_scale "$runs/bf16/metrics.jsonl" && fail "bf16 reports a loss scale" || pass "bf16 has no loss scale"

if [ "$fp16_ok" = 1 ]; then
  train run 2 "${common[@]}" --set run.name=fp16 --set train.precision=fp16
  expect_eq "$?" 0 "fp16 trains"
  fp16=$(accuracy)
  expect_lt "$(awk "BEGIN{d=$fp32-${fp16:-0}; print d<0?-d:d}")" 0.01 "fp16 accuracy $fp16 within 0.01 of fp32's $fp32"
  expect_grep "$runs/fp16/metrics.jsonl" '"loss_scale": 65536, "skipped_steps": 0' "metrics.jsonl has the loss scale"
else
  expect_eq "$(grep -c 'train.precision: fp16 on cpu: float16 autocast on the CPU needs LibTorch 2.4 or later' "$WORK/probe")" 1 \
    "fp16 on this LibTorch's CPU is refused with the reason"
  train run 2 "${common[@]}" --set run.name=fp16 --set train.precision=fp16
  expect_eq "$?" 2 "fp16 where unsupported exits 2 on 2 ranks"
fi

# 2. Resume bit-identical. fp16 (where it runs): a scale that overflows at
#    first, then grows after 30 clean steps, so the checkpoint at step 25
#    holds a growth tracker part-way that decides when the scale grows after
#    the resume: the loss scales logged after step 25 must equal the
#    uninterrupted run's. Else bf16 (autocast has no state).
precision=bf16
scaler=()
if [ "$fp16_ok" = 1 ]; then
  precision=fp16
  scaler=(--set train.loss_scale=16777216 --set train.loss_scale_growth_interval=30)
fi
common=(--set train.precision=$precision "${scaler[@]}" --set model.dropout=0.1 --set checkpoint.every=0
  --set optim.decay_steps=60)
train run 2 "${common[@]}" --set run.name=straight --set train.max_steps=60
straight=$(weights run)
train run 2 "${common[@]}" --set run.name=resumed --set train.max_steps=25
ckpt="$runs/resumed/checkpoints/step_00000025"
if [ "$fp16_ok" = 1 ]; then
  expect_grep "$ckpt/state.yaml" "^  _growth_tracker: [1-9][0-9]?\$" "state.yaml holds the growth tracker part-way"
  expect_grep "$ckpt/state.yaml" "^  scale: [0-9]" "state.yaml holds the scale"
  expect_grep "$runs/resumed/metrics.jsonl" '"skipped_steps": [1-9]' "the first steps overflowed and were skipped"
fi
train run 2 "${common[@]}" --set run.name=resumed --set train.max_steps=60 --set checkpoint.resume=auto
expect_grep "$WORK/run.out" "resumed from .*step_00000025 at step 25" "the $precision run resumed at step 25"
resumed=$(weights run)
[ -n "$straight" ] && expect_eq "$resumed" "$straight" "$precision: resumed run ends bit-identical to the uninterrupted one"
if [ "$fp16_ok" = 1 ]; then
  scales() { sed -n 's/.*"step": \([0-9]*\),.*"loss_scale": \([0-9.e+]*\),.*/\1 \2/p' "$1" | awk '$1 > 25'; }
  scales "$runs/straight/metrics.jsonl" >"$WORK/scales.straight"
  scales "$runs/resumed/metrics.jsonl" >"$WORK/scales.resumed"
  expect_lt 1 "$(awk '{print $2}' "$WORK/scales.straight" | uniq | wc -l)" "the scale grows after step 25"
  expect_eq "$(cat "$WORK/scales.resumed")" "$(cat "$WORK/scales.straight")" "the resumed run's loss scales after step 25 equal the uninterrupted run's"
fi

if [ "$fp16_ok" = 1 ]; then
  # A bf16 checkpoint has no scaler state: an fp16 resume from it starts a
  # fresh scaler, and says so.
  train run 2 --set run.name=nobf --set train.precision=bf16 --set train.max_steps=5
  train run 2 --set run.name=nobf --set train.precision=fp16 --set train.max_steps=10 --set checkpoint.resume=auto
  expect_eq "$?" 0 "fp16 resume from a checkpoint without a scaler's state continues"
  expect_grep "$WORK/run.out" "state.yaml: no GradScaler state .*starts fresh at train.loss_scale 65536" "with a fresh scaler, saying so"
  # A tampered scaler state (tracker past the interval) is refused by name.
  train run 2 --set run.name=bad --set train.precision=fp16 --set train.max_steps=5
  bad="$runs/bad/checkpoints/step_00000005"
  sed -i 's/^  _growth_tracker: .*/  _growth_tracker: 99999/' "$bad/state.yaml"
  (cd "$bad" && sed -i "s/^[0-9a-f]*  state.yaml\$/$(sha256sum state.yaml | cut -d' ' -f1)  state.yaml/" MANIFEST)
  train run 2 --set run.name=bad --set train.precision=fp16 --set train.max_steps=10 --set checkpoint.resume=auto
  expect_eq "$?" 2 "a scaler state with the tracker past the interval exits 2"
  expect_grep "$WORK/run.out" "_growth_tracker 99999" "naming the value"
  # A diverged run (lr 1e6: inf/NaN gradients at every scale) stops every
  # rank with exit 1 once the scale is gone, instead of stepping on NaNs.
  # (ranks started by hand: under lockstep-run the first to exit has the
  # other stopped, maybe before it said so)
  by_hand diverged 2 train --config "$root/configs/digits.yaml" --set run.dir="$runs" \
    --set run.name=diverged --set train.precision=fp16 --set optim.lr=1000000 --set train.epochs=20
  expect_eq "$(cat "$WORK/diverged.codes")" "1 1" "a diverged fp16 run exits 1 on every rank"
  for r in 0 1; do
    expect_grep "$WORK/diverged.$r" "training diverged: the last [0-9]+ steps had inf/NaN gradients" "rank $r says the run diverged"
  done
fi

# 3. With the comm hooks: the scaled gradients compressed to fp16 (2.x:
#    and bf16) still train to fp32's accuracy.
hooks=$(if [ "$fp16_ok" = 1 ]; then echo "bf16:fp16 fp16:fp16 fp16:bf16"; else echo "bf16:fp16"; fi)
for pair in $hooks; do
  train run 2 --set train.epochs=10 --set checkpoint.every=0 --set run.name="hook-${pair/:/-}" \
    --set train.precision="${pair%%:*}" --set ddp.comm_hook="${pair##*:}"
  got=$(accuracy)
  expect_lt "$(awk "BEGIN{d=$fp32-${got:-0}; print d<0?-d:d}")" 0.01 \
    "precision ${pair%%:*} with ddp.comm_hook ${pair##*:}: accuracy $got within 0.01 of fp32's"
done

# 4. The GPT: 80 steps of a small GPT on 200 KB of the demo's text in bf16
#    end within 0.05 nats/byte of fp32's validation loss.
text="$root/data/kjv.txt"
if [ -f "$text" ]; then
  head -c 200000 "$text" >"$WORK/kjv-head.txt"
  gpt() {
    "$LOCKSTEP_RUN" --nproc-per-node 2 --master-port 0 "$LOCKSTEP" train --config "$root/configs/gpt-text.yaml" \
      --set run.dir="$runs" --set run.name="gpt-$1" --set data.path="$WORK/kjv-head.txt" \
      --set model.n_layer=2 --set model.n_head=2 --set model.n_embd=64 --set model.block_size=64 \
      --set data.batch_size=8 --set train.max_steps=80 --set checkpoint.every=0 --set log.every=20 \
      --set optim.warmup_steps=5 --set train.precision="$1" --set log.progress=plain >"$WORK/gpt-$1" 2>&1
    sed -n 's/.*validation: loss \([0-9.]*\).*/\1/p' "$WORK/gpt-$1" | tail -1
  }
  gpt32=$(gpt fp32)
  gpt16=$(gpt bf16)
  expect_lt "$(awk "BEGIN{d=${gpt32:-9}-${gpt16:-0}; print d<0?-d:d}")" 0.05 \
    "GPT in bf16: validation loss $gpt16 within 0.05 of fp32's $gpt32"
else
  fail "$text is missing (scripts/make_text.sh makes it; scripts/setup.sh runs that)"
fi

# 5. The consistency-check mode under autocast: identical after every step,
#    the unsynchronised control caught.
"$LOCKSTEP_RUN" --nproc-per-node 2 --master-port 0 "$LOCKSTEP" check --config "$root/configs/digits.yaml" \
  --set train.precision=bf16 --steps 5 >"$WORK/check" 2>&1
expect_eq "$?" 0 "lockstep check --config with bf16 passes"
expect_grep "$WORK/check" "result: PASS" "check mode verdict"
if [ "$fp16_ok" = 1 ]; then
  "$LOCKSTEP_RUN" --nproc-per-node 2 --master-port 0 "$LOCKSTEP" check --config "$root/configs/digits.yaml" \
    --set train.precision=fp16 --steps 5 >"$WORK/check" 2>&1
  expect_eq "$?" 0 "lockstep check --config with fp16 (the GradScaler) passes"
  # A scale that overflows: the first steps are skipped on every rank, so
  # the control is caught at the first step taken, not at step 1.
  "$LOCKSTEP_RUN" --nproc-per-node 2 --master-port 0 "$LOCKSTEP" check --config "$root/configs/digits.yaml" \
    --set train.precision=fp16 --set train.loss_scale=16777216 --steps 20 >"$WORK/check" 2>&1
  expect_eq "$?" 0 "fp16 check mode whose first steps are skipped passes"
  expect_grep "$WORK/check" "PASS \(divergence caught at step ([2-9]|1[0-9]), the first the GradScaler did not skip" "the control is caught at the first step taken"
fi
finish
