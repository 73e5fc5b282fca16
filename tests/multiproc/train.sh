#!/usr/bin/env bash
# lockstep train end to end on 2 ranks: a short run, checkpoints Python can
# open, resume bit-identity, accumulation equivalence, init_from a Python
# state dict, and the bad-input cases (corrupt checkpoint, unwritable run
# directory, malformed YAML, ranks with different configs, kill -9 while
# checkpointing).
source "$(dirname "$0")/lib.sh"
root=$(cd "$(dirname "$0")/../.." && pwd)
runs=$RUNS
TRAIN_ARGS=(--set log.every=5)

# 1. A short run: metrics, checkpoint with a valid manifest, Python opens it.
train run 2 --set run.name=short --set train.max_steps=30 --set checkpoint.every=10 --set log.file=true \
  --set log.trace=true --set ddp.bucket_cap_mb=0.01 --set ddp.first_bucket_cap_mb=0.001 \
  --set log.sync_timing=true
expect_eq "$?" 0 "a 30-step 2-rank run exits 0 (log.sync_timing on the CPU: nothing to wait for)"
expect_grep "$runs/short/rank_1.log" "\[info\] done: 30 steps" "rank 1's own log file"
expect_grep "$runs/short/config.yaml" "^  max_steps: 30\$" "the resolved config is saved"
ckpt="$runs/short/checkpoints/step_00000030"
expect_grep "$runs/short/metrics.jsonl" '"step": 30, .*"loss": [0-9.e-]+' "metrics.jsonl has the global loss"
expect_grep "$runs/short/metrics.jsonl" '"comm_wait": [0-9.]+, "clip": [0-9.]+, "optimizer": [0-9.]+' \
  "metrics split the step time, clipping apart from the optimizer"
expect_eq "$(ls "$runs/short/checkpoints" | tr '\n' ' ')" "step_00000010 step_00000020 step_00000030 " "checkpoints every 10 steps"
(cd "$ckpt" && sha256sum -c --quiet MANIFEST) && pass "MANIFEST verifies with sha256sum" || fail "MANIFEST does not verify"
$PY -c "
import torch, sys
sd = torch.load('$ckpt/model.pt')
assert isinstance(sd, dict), type(sd)
assert list(sd)[:2] == ['layers.0.weight', 'layers.0.bias'], list(sd)
assert tuple(sd['layers.0.weight'].shape) == (128, 64)
" && pass "torch.load opens model.pt with PyTorch names" || fail "torch.load could not open model.pt"

$PY -c "
import json
for rank in (0, 1):
    trace = json.load(open('$runs/short/trace_rank%d.json' % rank))
    ev = [e for e in trace['traceEvents'] if e['ph'] == 'X']
    assert all(isinstance(e['ts'], float) and e['dur'] >= 0 and e['pid'] == rank for e in ev)
    names = {e['name'].split(' (')[0] for e in ev}
    need = {'forward', 'backward', 'clipping', 'optimizer step', 'consistency check', 'wait for buckets',
            'allreduce bucket 0', 'allreduce bucket 2'}
    assert need <= names, need - names
    # Overlap: some bucket's all-reduce starts before its step's backward ends.
    backward = [e for e in ev if e['name'] == 'backward']
    buckets = [e for e in ev if e['name'].startswith('allreduce bucket 0')]
    assert any(b['ts'] < w['ts'] + w['dur'] and b['ts'] >= w['ts'] for b in buckets for w in backward)
" && pass "traces: valid Chrome trace JSON per rank, all-reduces overlap backward" || fail "trace invalid"
$PY "$root/scripts/plot_metrics.py" "$runs/short" "$WORK/plots" >/dev/null
for png in loss step_time comm_share training; do
  [ "$(head -c 8 "$WORK/plots/$png.png" | od -An -tx1 | tr -d ' ')" = 89504e470d0a1a0a ] &&
    pass "plot $png.png is a PNG" || fail "plot $png.png missing or not a PNG"
done

# 2. Resume: 25 steps + resume to 50 ends bit-identical to 50 straight
#    (dropout on, so the per-rank generators must be restored too). The
#    schedule's length is set apart from max_steps, as nanoGPT's
#    lr_decay_iters (Note [Schedule length]), so both halves decay alike.
common=(--set model.dropout=0.1 --set checkpoint.every=0 --set optim.decay_steps=50)
train run 2 "${common[@]}" --set run.name=straight --set train.max_steps=50
straight=$(weights run)
train run 2 "${common[@]}" --set run.name=resumed --set train.max_steps=25
train run 2 "${common[@]}" --set run.name=resumed --set train.max_steps=50 --set checkpoint.resume=auto
expect_grep "$WORK/run.out" "resumed from .*step_00000025 at step 25" "the second half resumed at step 25"
resumed=$(weights run)
[ -n "$straight" ] && expect_eq "$resumed" "$straight" "resumed run ends bit-identical to the uninterrupted one"

# 2b. Schedules by steps (Note [Schedule length]): a run stopped by
#     max_steps ends its cosine at min_lr on its last step; a resume follows
#     its own config (no max_steps: the epochs' end) and says so; a length
#     set by optim.decay_steps is kept by a resume that sets none, with a
#     warning for the steps past it.
lr_of() {  # RUN STEP: the lr of that step's training record
  grep "^{\"step\": $2, .*\"lr\"" "$runs/$1/metrics.jsonl" | head -1 | grep -o '"lr": [0-9.e+-]*' | awk '{print $2}'
}
same_lr() { awk -v a="$1" -v b="$2" 'BEGIN{exit !(a != "" && a == b)}'; }
sched=(--set optim.min_lr=0.001 --set log.every=1 --set checkpoint.every=10 --set log.progress=plain)
train run 2 "${sched[@]}" --set run.name=sched --set train.max_steps=30
same_lr "$(lr_of sched 30)" 0.001 && pass "the cosine reaches min_lr on the last of max_steps (step 30)" ||
  fail "the lr of step 30 is '$(lr_of sched 30)', not min_lr 0.001"
awk -v a="$(lr_of sched 29)" 'BEGIN{exit !(a > 0.0011)}' && pass "and is above it the step before" ||
  fail "step 29's lr '$(lr_of sched 29)' is already min_lr"
train run 2 "${sched[@]}" --set run.name=toend --set train.epochs=2 \
  --set checkpoint.resume="$runs/sched/checkpoints/step_00000010"
expect_grep "$WORK/run.out" "done: 46 steps" "resumed without max_steps, it trains to the epochs' end"
expect_grep "$WORK/run.out" "schedule length 30 -> 46 steps \(from the epochs\)" "and its schedule with it, said in the log"
same_lr "$(lr_of toend 46)" 0.001 && pass "ending at min_lr on step 46" || fail "step 46's lr is '$(lr_of toend 46)'"
train run 2 "${sched[@]}" --set run.name=decay --set train.max_steps=20 --set optim.decay_steps=30
train run 2 "${sched[@]}" --set run.name=decay --set train.max_steps=40 --set checkpoint.resume=auto
grep -q "schedule length" "$WORK/run.out" && fail "the resume changed a length decay_steps set: $(grep -o 'schedule length[^;]*' "$WORK/run.out")" ||
  pass "a resume without optim.decay_steps keeps the length it set (30)"
expect_grep "$WORK/run.out" "the run trains to step 40 but the schedule's length is 30 steps: steps 31..40 run at optim.min_lr=0.001" "and warns of the steps past it"
same_lr "$(lr_of decay 30)" 0.001 && same_lr "$(lr_of decay 40)" 0.001 &&
  awk -v a="$(lr_of decay 25)" 'BEGIN{exit !(a > 0.0011)}' && pass "its lr reaches min_lr at step 30 and stays" ||
  fail "lr at steps 25/30/40: $(lr_of decay 25) $(lr_of decay 30) $(lr_of decay 40)"
train run 2 "${sched[@]}" --set run.name=longer --set train.max_steps=40 \
  --set checkpoint.resume="$runs/sched/checkpoints/step_00000010"
expect_grep "$WORK/run.out" "schedule length 30 -> 40 steps \(from train.max_steps\)" "a new max_steps is a new length, said in the log"
same_lr "$(lr_of longer 40)" 0.001 && pass "that run ends at min_lr on its step 40" ||
  fail "step 40's lr is '$(lr_of longer 40)'"

# 2b. The shm backend (auto's choice on one host) and Gloo train the same
#     bits: two ranks' sums do not depend on the order.
train run 2 "${common[@]}" --set run.name=on-gloo --set train.max_steps=40 --set dist.backend=gloo
on_gloo=$(weights run)
train run 2 "${common[@]}" --set run.name=on-shm --set train.max_steps=40 --set dist.backend=shm
on_shm=$(weights run)
[ -n "$on_gloo" ] && expect_eq "$on_shm" "$on_gloo" "40 steps on shm end bit-identical to 40 on gloo"

# 3. Accumulation: 2 x 16 with no_sync equals one batch of 32.
train run 2 --set run.name=acc1 --set train.max_steps=20 --set data.batch_size=32 --set optim.schedule=constant
train run 2 --set run.name=acc2 --set train.max_steps=20 --set data.batch_size=16 \
  --set train.accumulation_steps=2 --set optim.schedule=constant
$PY -c "
import torch
a = torch.load('$runs/acc1/checkpoints/step_00000020/model.pt')
b = torch.load('$runs/acc2/checkpoints/step_00000020/model.pt')
worst = max(((a[k] - b[k]).abs().max() / a[k].abs().max()).item() for k in a)
assert worst < 1e-4, worst
print('max relative difference', worst)
" && pass "accumulation 2x16 matches batch 32 after 20 steps" || fail "accumulation differs"

# 4. init_from a state dict written by Python (lr 0 keeps it unchanged).
$PY -c "
import torch, torch.nn as nn
class Net(nn.Module):
    def __init__(s, h):
        super().__init__()
        s.layers = nn.Sequential(nn.Linear(64, h), nn.ReLU(), nn.Linear(h, h), nn.ReLU(), nn.Linear(h, 10))
torch.manual_seed(5)
torch.save(Net(128).state_dict(), '$WORK/python.pt')
torch.save(Net(64).state_dict(), '$WORK/wrong.pt')
"
train run 2 --set run.name=init --set train.max_steps=3 --set model.init_from="$WORK/python.pt" \
  --set optim.lr=0 --set optim.warmup_steps=0
expect_eq "$?" 0 "init_from a Python state dict"
$PY -c "
import torch
a = torch.load('$WORK/python.pt'); b = torch.load('$runs/init/checkpoints/step_00000003/model.pt')
assert all(torch.equal(a[k], b[k]) for k in a), 'differs'
" && pass "the Python weights arrived bit for bit" || fail "init_from weights differ"
train run 2 --set run.name=wrong --set model.init_from="$WORK/wrong.pt"
expect_eq "$?" 2 "a mis-shaped state dict exits 2"
expect_grep "$WORK/run.out" "tensor 'layers.0.weight' has shape \[64, 64\] but the model's is \[128, 64\]" "and names the tensor and shapes"

# 5. A corrupted checkpoint is refused and nothing is overwritten.
truncate -s 100 "$ckpt/model.pt"
before=$(find "$runs/short/checkpoints" -exec stat -c '%n %s %Y' {} + | sort | md5sum)
train run 2 --set run.name=short --set train.max_steps=40 --set checkpoint.resume=auto
expect_eq "$?" 2 "resuming from a truncated checkpoint exits 2"
expect_grep "$WORK/run.out" "step_00000030': model.pt's SHA-256 does not match its MANIFEST" "and names the file"
expect_eq "$(find "$runs/short/checkpoints" -exec stat -c '%n %s %Y' {} + | sort | md5sum)" "$before" "no checkpoint was touched"

# 6. Bad input before any training.
train run 1 --set run.dir=/proc/lockstep-no
expect_eq "$?" 2 "an unwritable run directory exits 2"
expect_grep "$WORK/run.out" "cannot create '/proc/lockstep-no'" "and names it"
printf 'optim:\n  lr: [0.1\n' >"$WORK/bad.yaml"
"$LOCKSTEP" train --config "$WORK/bad.yaml" >"$WORK/run.out" 2>&1
expect_eq "$?" 2 "malformed YAML exits 2"
expect_grep "$WORK/run.out" "bad.yaml:[0-9]+:[0-9]+: malformed YAML" "with line and column"
"$LOCKSTEP_RUN" --nproc-per-node 2 --master-port 0 sh -c \
  "exec '$LOCKSTEP' train --config '$root/configs/digits.yaml' --set run.dir='$runs' --set optim.lr=0.0\$((RANK + 1))" \
  >"$WORK/run.out" 2>&1
expect_grep "$WORK/run.out" "configuration of rank\(s\) 1 differs from rank 0's" "ranks with different configs are named"

# 7. kill -9 while checkpointing every step: the newest complete checkpoint
#    still verifies and resume continues from it.
marker="lockstep-kill-test-$$"
"$LOCKSTEP_RUN" --nproc-per-node 2 --master-port 0 "$LOCKSTEP" train --config "$root/configs/digits.yaml" \
  --set run.dir="$runs" --set run.name="$marker" --set model.hidden=512 --set optim.name=adam \
  --set optim.lr=0.001 --set checkpoint.every=1 --set checkpoint.keep=2 --set train.epochs=100 \
  >"$WORK/run.out" 2>&1 &
two_checkpoints() { [ "$(ls "$runs/$marker/checkpoints" 2>/dev/null | grep -c step_)" -ge 2 ]; }
wait_for 120 "the kill test's second checkpoint" two_checkpoints
sleep 0.3
pkill -9 -f "run.name=$marker"
wait 2>/dev/null
newest=$(ls -d "$runs/$marker"/checkpoints/step_* | tail -1)
(cd "$newest" && sha256sum -c --quiet MANIFEST) && pass "after kill -9 the newest checkpoint verifies" || fail "newest checkpoint broken after kill -9"
step=$((10#${newest##*step_}))
train run 2 --set run.name="$marker" --set model.hidden=512 --set optim.name=adam --set optim.lr=0.001 \
  --set train.epochs=100 --set checkpoint.resume=auto --set train.max_steps=$((step + 2))
expect_eq "$?" 0 "resume after kill -9 succeeds"
expect_grep "$WORK/run.out" "resumed from .*at step $step " "from the newest checkpoint"
sleep 0.3
expect_eq "$(leftovers "$marker")" "" "no process left after the kill"

# A dataset larger than memory is bad input (exit 2), not an internal error.
"$LOCKSTEP" train --config "$root/configs/digits.yaml" --set run.dir="$runs" --set data.name=synthetic \
  --set data.synthetic_size=1000000000 --set data.synthetic_features=1048576 >"$WORK/run.out" 2>&1
expect_eq "$?" 2 "synthetic_size=1e9 x 2^20 features exits 2"
expect_grep "$WORK/run.out" "the dataset \(section data\) does not fit in this machine's memory" "and says why"

# An empty validation split is said, not reported as "accuracy 0.0000".
printf 'a,b,label\n1,2,0\n3,4,1\n5,6,0\n7,8,1\n' >"$WORK/four.csv"
"$LOCKSTEP" train --config "$root/configs/digits.yaml" --set run.dir="$runs" --set data.name=csv \
  --set data.path="$WORK/four.csv" --set data.validation_fraction=0.1 --set data.batch_size=2 \
  --set train.max_steps=2 >"$WORK/run.out" 2>&1
expect_eq "$?" 0 "a run whose validation split is empty trains"
expect_grep "$WORK/run.out" "the validation split is empty \(4 examples x data.validation_fraction=0.1 holds none\)" "and warns that it is empty"
expect_grep "$WORK/run.out" "trained 2 steps: no validation \(empty split\)" "and reports no validation"
if grep -q "accuracy 0.0000" "$WORK/run.out"; then fail "an empty split still reports accuracy 0.0000"; else pass "no accuracy is made up"; fi

# Rotation removes only our own checkpoints: a user's step_best_keep_me/ and
# a step_-named folder without our MANIFEST survive keep=1.
mkdir -p "$runs/rot/checkpoints/step_best_keep_me" "$runs/rot/checkpoints/step_00000001"
echo mine >"$runs/rot/checkpoints/step_best_keep_me/notes.txt"
train run 2 --set run.name=rot --set train.max_steps=30 --set checkpoint.every=10 --set checkpoint.keep=1
expect_eq "$?" 0 "a keep=1 run next to the user's folders exits 0"
expect_eq "$(ls "$runs/rot/checkpoints" | tr '\n' ' ')" "step_00000001 step_00000030 step_best_keep_me " \
  "rotation kept the newest checkpoint and every folder that is not ours"
expect_eq "$(cat "$runs/rot/checkpoints/step_best_keep_me/notes.txt")" mine "the user's file is intact"
finish
