#!/usr/bin/env bash
# optim.zero 3, fully sharded parameters (docs/zero.md, Note [Fully sharded
# parameters]):
# 1. the digits on 2 and 3 ranks, SGD with momentum and AdamW with clipping:
#    final weights bit-identical to optim.zero 0, optimizer.pt byte-identical;
# 2. the GPT (dropout 0.1, AdamW, clipping, every block a unit) on 2 and 3
#    ranks, fp32 and bf16, with and without activation checkpointing, and
#    with gradient accumulation (no_sync): bit-identical to optim.zero 0;
#    each rank holds about 1/world of the weights between steps (its log);
# 3. resume across stages and world sizes: zero 0 on 2 ranks -> zero 3 on 3
#    -> zero 0 on 1, within 1e-6 of the uninterrupted run; PyTorch loads the
#    zero-3 checkpoint's model.pt; lockstep eval and generate read it;
# 4. a flipped bit in a shard (LOCKSTEP_FAULT=flip) is caught at the next
#    step and named with its rank; the same flip without sharding is caught
#    by the cross-rank check;
# 5. what cannot work says so (exit 2): PowerSGD, check.policy resync,
#    lockstep check --config.
#   zero3.sh LOCKSTEP LOCKSTEP_RUN
source "$(dirname "$0")/lib.sh"
root=$(cd "$(dirname "$0")/../.." && pwd)
runs=$RUNS
export OMP_NUM_THREADS=1
text="$root/data/kjv.txt"
[ -f "$text" ] || { fail "$text is missing (scripts/make_text.sh makes it; scripts/setup.sh runs that)"; finish; }
head -c 100000 "$text" >"$WORK/kjv-head.txt"

# 1. The digits (one unit: the whole MLP).
for n in 2 3; do
  for opt in "sgd --set optim.momentum=0.9" "adamw --set optim.lr=0.003 --set optim.weight_decay=0.05"; do
    name=${opt%% *}
    for z in 0 3; do
      # shellcheck disable=SC2086
      train "$name-$n-$z" "$n" --config "$ROOT/configs/digits.yaml" --set optim.name=$opt --set optim.zero=$z \
        --set train.clip_grad_norm=0.5 --set train.max_steps=30 --set checkpoint.every=30
      [ "$?" = 0 ] || { fail "$name on $n ranks, optim.zero $z, did not train"; tail -5 "$WORK/$name-$n-$z.out"; }
    done
    same "$name-$n-3" "$name-$n-0" "digits, $name, $n ranks, clipping: optim.zero 3 ends bit-identical to 0"
  done
done
ck() { echo "$runs/$1/checkpoints/step_00000030/$2"; }
cmp -s "$(ck adamw-3-0 optimizer.pt)" "$(ck adamw-3-3 optimizer.pt)" &&
  pass "optimizer.pt of optim.zero 3 (3 ranks) is byte-identical to optim.zero 0's" ||
  fail "optimizer.pt of optim.zero 3 differs from optim.zero 0's"
expect_grep "$WORK/adamw-3-3.out" "optim.zero: 3: this rank owns .* between uses each weight lives on its owner only" \
  "each rank says what it owns"

# 2. The GPT: every block a unit, the embeddings and head the root.
gpt=(--set data.path="$WORK/kjv-head.txt" --set model.n_layer=3 --set model.n_head=2 --set model.n_embd=64
     --set model.block_size=64 --set data.batch_size=8 --set train.max_steps=10 --set checkpoint.every=10
     --set log.every=5 --set model.dropout=0.1 --set optim.warmup_steps=2 --set data.validation_fraction=0.05
     --set train.eval_batches=2)
for case in "2 fp32 false 1" "2 fp32 true 1" "2 bf16 true 1" "3 fp32 false 1" "3 bf16 false 2" "3 fp32 true 2"; do
  read -r n prec ac acc <<<"$case"
  for z in 0 3; do
    train "gpt-$n-$prec-$ac-$acc-$z" "$n" --config "$ROOT/configs/gpt-text.yaml" "${gpt[@]}" --set optim.zero=$z --set train.precision="$prec" \
      --set model.activation_checkpointing="$ac" --set train.accumulation_steps="$acc"
    [ "$?" = 0 ] || { fail "GPT $case zero $z did not train"; tail -5 "$WORK/gpt-$n-$prec-$ac-$acc-$z.out"; }
  done
  same "gpt-$n-$prec-$ac-$acc-3" "gpt-$n-$prec-$ac-$acc-0" \
    "GPT, $n ranks, $prec, activation checkpointing $ac, accumulation $acc: optim.zero 3 = 0 bit for bit"
done
# Each rank holds its share of the weights between steps (rank 0 of 3: about a third).
held=$(grep -o "\[rank0\]: .*memory: weights [0-9.]* MiB held" "$WORK/gpt-3-fp32-false-1-3.out" | grep -oE "[0-9.]+ MiB" | awk '{print $1}')
total=$($PY - "$runs/gpt-3-fp32-false-1-3/checkpoints/step_00000010/model.pt" <<'PY'
import sys, torch
print(sum(t.numel() * t.element_size() for t in torch.load(sys.argv[1]).values()) / 2**20)
PY
)
awk -v h="${held:-0}" -v t="${total:-0}" 'BEGIN{exit !(t > 0 && h > 0.2 * t && h < 0.5 * t)}' &&
  pass "rank 0 of 3 holds ${held} MiB of the ${total} MiB of weights between steps" ||
  fail "rank 0 of 3 holds ${held:-?} MiB of ${total:-?} MiB of weights"

# 3. Resume across stages and world sizes (the digits, global batch 96).
common=(--set optim.schedule=constant --set optim.warmup_steps=0 --set train.epochs=6)
train whole 2 --config "$ROOT/configs/digits.yaml" "${common[@]}" --set data.batch_size=48 --set train.max_steps=29
train el 2 --config "$ROOT/configs/digits.yaml" "${common[@]}" --set data.batch_size=48 --set train.max_steps=20 --set checkpoint.every=20
train el 3 --config "$ROOT/configs/digits.yaml" "${common[@]}" --set data.batch_size=32 --set train.max_steps=25 --set checkpoint.every=25 \
  --set checkpoint.resume=auto --set optim.zero=3
expect_eq "$?" 0 "a zero-0 checkpoint of 2 ranks resumes with optim.zero 3 on 3 ranks"
expect_grep "$WORK/el.out" "optim.zero 0 -> 3" "the resume message names the stage change"
train el 1 --config "$ROOT/configs/digits.yaml" "${common[@]}" --set data.batch_size=96 --set train.max_steps=29 --set checkpoint.resume=auto
expect_eq "$?" 0 "the zero-3 checkpoint of 3 ranks resumes with optim.zero 0 on 1 rank"
diff=$($PY - "$runs/whole/checkpoints/step_00000029/model.pt" "$runs/el/checkpoints/step_00000029/model.pt" \
  "$runs/el/checkpoints/step_00000025/model.pt" <<'PY'
import sys, torch
a, b, c = (torch.load(p) for p in sys.argv[1:])
assert a.keys() == b.keys() == c.keys()
assert all(torch.isfinite(t).all() for t in c.values())  # no placeholder NaN in zero 3's file
print(max((a[k] - b[k]).abs().max().item() for k in a))
PY
)
expect_lt "${diff:-1}" 1e-6 "2 (zero 0) -> 3 (zero 3) -> 1 (zero 0): the weights within 1e-6 of the uninterrupted run ($diff)"
gdir="$runs/gpt-2-fp32-true-1-3"
"$LOCKSTEP" generate --checkpoint "$gdir" --prompt "In the" --max-new-tokens 20 --seed 1 >"$WORK/gen.out" 2>&1
expect_eq "$?" 0 "lockstep generate samples from a zero-3 run's checkpoint"
"$LOCKSTEP" generate --checkpoint "$runs/gpt-2-fp32-true-1-0" --prompt "In the" --max-new-tokens 20 --seed 1 \
  >"$WORK/gen0.out" 2>&1
cmp -s "$WORK/gen.out" "$WORK/gen0.out" && pass "and draws the text zero 0's checkpoint draws" ||
  fail "generate from zero 3 and zero 0 checkpoints differ"
"$LOCKSTEP_RUN" --nproc-per-node 3 --master-port 0 "$LOCKSTEP" eval --checkpoint "$runs/gpt-3-fp32-false-1-3" \
  --output "$WORK/eval.json" >"$WORK/eval.out" 2>&1
expect_eq "$?" 0 "lockstep eval on 3 ranks reads a zero-3 checkpoint"
$PY - "$WORK/eval.json" "$runs/gpt-3-fp32-false-1-3/metrics.jsonl" <<'PY' >"$WORK/eval.check" 2>&1
import json, sys
e = json.load(open(sys.argv[1]))
val = [json.loads(l) for l in open(sys.argv[2]) if '"val_loss"' in l][-1]
assert abs(e["loss"] - val["val_loss"]) < 2e-6, (e["loss"], val["val_loss"])
print(e["loss"])
PY
expect_eq "$?" 0 "and its loss is the zero-3 trainer's own evaluation on 3 ranks ($(tail -1 "$WORK/eval.check"))"

# 4. A flipped bit in a shard.
LOCKSTEP_FAULT=flip:rank=1:step=4 train flip 2 --config "$ROOT/configs/gpt-text.yaml" "${gpt[@]}" --set optim.zero=3
expect_eq "$?" 1 "a flipped bit in rank 1's shard stops the run"
flipped=$(grep -o "flipped a bit of '[^']*' on rank 1" "$WORK/flip.out" | head -1 | cut -d"'" -f2)
expect_grep "$WORK/flip.out" "step 5: weight '${flipped:-none}' \(optim.zero 3: held by rank 1 only\) changed after its optimizer step" \
  "the shard seal names the weight (${flipped:-none}) and its rank at the next step"
# The seal is taken after every step, whatever check.every: a flip between
# two checks is caught too, and never saved.
LOCKSTEP_FAULT=flip:rank=1:step=5 train flip2 2 --config "$ROOT/configs/gpt-text.yaml" "${gpt[@]}" --set optim.zero=3 --set check.every=2
expect_eq "$?" 1 "check.every 2, a flip after step 5: the run stops"
expect_grep "$WORK/flip2.out" "step 6: weight '.*' \(optim.zero 3: held by rank 1 only\) changed after its optimizer step" \
  "caught at step 6, the next step"
[ -d "$runs/flip2/checkpoints/step_00000010" ] && fail "a checkpoint of the flipped weights was written" ||
  pass "no checkpoint of the flipped weights"
LOCKSTEP_FAULT=flip:rank=1:step=4 train flip0 2 --config "$ROOT/configs/gpt-text.yaml" "${gpt[@]}" --set optim.zero=0
expect_eq "$?" 1 "without sharding the same flip stops the run too"
expect_grep "$WORK/flip0.out" "weights differ across ranks after step [45]: first differing tensor .transformer.wte.weight." "and the cross-rank check names the weight"

# 5. What zero 3 refuses.
bad() {  # bad WHAT PATTERN ARGS...
  local what=$1 pattern=$2
  shift 2
  train bad 2 --config "$ROOT/configs/digits.yaml" --set train.max_steps=2 "$@"
  expect_eq "$?" 2 "$what: exit 2"
  expect_grep "$WORK/bad.out" "$pattern" "$what: the error names it"
}
bad "optim.zero 3 with PowerSGD" "optim.zero: 3 .*ddp.comm_hook" --set optim.zero=3 --set ddp.comm_hook=powersgd
bad "optim.zero 3 with check.policy resync" "check.policy: resync .*optim.zero: 3" --set optim.zero=3 --set check.policy=resync
bad "optim.zero 4" "optim.zero.*4" --set optim.zero=4
bad "optim.zero 3 with ddp.find_unused_parameters" "ddp.find_unused_parameters: optim.zero: 3" --set optim.zero=3 --set ddp.find_unused_parameters=true
bad "optim.zero 3 with check.buffers" "check.buffers .*optim.zero: 3" --set optim.zero=3 --set check.buffers=true
"$LOCKSTEP_RUN" --nproc-per-node 2 --master-port 0 "$LOCKSTEP" check --config "$root/configs/digits.yaml" \
  --set optim.zero=3 >"$WORK/check.out" 2>&1
expect_eq "$?" 2 "lockstep check --config with optim.zero 3: exit 2"
expect_grep "$WORK/check.out" "optim.zero: 3 keeps each weight on one rank only" "and says why"
finish
