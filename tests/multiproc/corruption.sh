#!/usr/bin/env bash
# Silent corruption (Note [Silent corruption], check/corruption.cpp): a
# rank's wrong local gradient, injected with LOCKSTEP_FAULT grad-flip or
# act-flip, against an uninjected run of the same length.
# 1. The blind spot: with the per-step weight check alone the run passes
#    every check and ends with other weights than the uninjected run's.
# 2. The replay (check.replay_every) catches a mantissa flip at a replay
#    step and names the rank, exit 6: DDP on 2 and 3 ranks, act-flip,
#    ZeRO-2 with bf16 and accumulation.
# 3. check.on_corruption: skip takes the step again: the final weights are
#    the uninjected run's, bit for bit (DDP, ZeRO-2 bf16, BatchNorm); refused
#    with PowerSGD, whose state has absorbed the step thrown away.
# 4. The screen (check.grad_screen) catches an exponent flip at any step,
#    under DDP and ZeRO-3; the replay under ZeRO-3 catches both faults
#    (2 and 3 ranks, bf16), its skip leaves the uninjected run's weights and
#    a replay every step changes nothing.
# 5. No false positive: screen and replay at every step on clean runs
#    (3 ranks, ZeRO-2 bf16 with accumulation, PowerSGD, fp16).
source "$(dirname "$0")/lib.sh"
TRAIN_ARGS=(--set checkpoint.every=0 --set train.max_steps=30)
Z2=(--set optim.zero=2 --set optim.name=adam --set train.precision=bf16 --set train.accumulation_steps=2)

caught() {  # caught NAME RANK STEP CHECK WHAT
  expect_grep "$WORK/$1.out" "root cause: rank [0-9]+ .*exited with code 6" "$5: exit 6, the root cause"
  expect_grep "$WORK/$1.out" "silent data corruption: step $3: rank $2 \\(host [^)]*, cpu\\), found by $4" \
    "$5: rank $2 named at step $3 by $4"
}

# 1. The blind spot, and the references.
train base 2
train base3 3
train z2base 2 "${Z2[@]}"
LOCKSTEP_FAULT=grad-flip:rank=1:step=10 train blind 2 --set check.every=1
expect_eq "$?" 0 "grad-flip with the weight check alone: the run ends with exit 0"
[ "$(weights blind)" != "$(weights base)" ] && [ -n "$(weights blind)" ] &&
  pass "... and other weights than the uninjected run's (the check cannot see it)" ||
  fail "the injected run's weights: '$(weights blind)', the uninjected: '$(weights base)'"

# 2. The replay names the rank.
LOCKSTEP_FAULT=grad-flip:rank=1:step=10 train replay2 2 --set check.replay_every=5
expect_eq "$?" 6 "grad-flip at a replay step, 2 ranks: exit 6"
caught replay2 1 10 check.replay_every "2 ranks"
expect_grep "$WORK/runs/replay2/metrics.jsonl" '"step": 10, "corruption": {"rank": 1, "other": -1, "check": "replay"' \
  "metrics.jsonl holds the finding"
LOCKSTEP_FAULT=grad-flip:rank=2:step=10 train replay3 3 --set check.replay_every=10
caught replay3 2 10 check.replay_every "3 ranks"
LOCKSTEP_FAULT=act-flip:rank=0:step=20 train act3 3 --set check.replay_every=10
caught act3 0 20 check.replay_every "act-flip, 3 ranks"
LOCKSTEP_FAULT=grad-flip:rank=0:step=20 train z2replay 2 "${Z2[@]}" --set check.replay_every=10
caught z2replay 0 20 check.replay_every "ZeRO-2, bf16, accumulation"

# 3. skip: the step taken again, the run as if nothing happened.
LOCKSTEP_FAULT=grad-flip:rank=1:step=10 train skip 2 --set check.replay_every=5 \
  --set check.on_corruption=skip
expect_eq "$?" 0 "skip: the run goes on"
expect_grep "$WORK/skip.out" "the step is taken again" "saying so"
same skip base "skip: the final weights are the uninjected run's"
LOCKSTEP_FAULT=act-flip:rank=1:step=20 train z2skip 2 "${Z2[@]}" --set check.replay_every=10 \
  --set check.grad_screen=true --set check.on_corruption=skip
same z2skip z2base "skip under ZeRO-2, bf16, accumulation: the uninjected run's weights"

BN=(--set model.name=cnn --set model.batch_norm=true)
train bnbase 2 "${BN[@]}"
LOCKSTEP_FAULT=grad-flip:rank=0:step=10 train bnskip 2 "${BN[@]}" --set check.replay_every=5 \
  --set check.on_corruption=skip
same bnskip bnbase "skip with BatchNorm: its statistics as the uninjected run's too"
train psgdskip 2 --set ddp.comm_hook=powersgd --set check.on_corruption=skip
expect_eq "$?" 2 "skip with PowerSGD's state across steps: exit 2"
expect_grep "$WORK/psgdskip.out" "check.on_corruption: skip.*ddp.comm_hook: powersgd" "naming both keys"

# 4. The screen, at a step that is no replay step.
LOCKSTEP_FAULT=grad-flip:rank=1:step=13:bit=30 train screen 2 --set check.grad_screen=true
caught screen 1 13 check.grad_screen "an exponent bit"
LOCKSTEP_FAULT=grad-flip:rank=2:step=7:bit=30 train z3screen 3 --set optim.zero=3 \
  --set check.grad_screen=true
caught z3screen 2 7 check.grad_screen "ZeRO-3, 3 ranks"

# ZeRO-3: the replay gathers the units and reduces nothing.
Z3=(--set optim.zero=3)
train z3base 2 "${Z3[@]}"
train z3clean 2 "${Z3[@]}" --set check.replay_every=1
same z3clean z3base "ZeRO-3, a replay every step: the weights of a run without it"
LOCKSTEP_FAULT=grad-flip:rank=1:step=10 train z3replay 2 "${Z3[@]}" --set check.replay_every=5
caught z3replay 1 10 check.replay_every "ZeRO-3, 2 ranks"
LOCKSTEP_FAULT=act-flip:rank=2:step=10 train z3act 3 "${Z3[@]}" --set train.precision=bf16 \
  --set check.replay_every=5
caught z3act 2 10 check.replay_every "ZeRO-3, act-flip, bf16, 3 ranks"
LOCKSTEP_FAULT=grad-flip:rank=0:step=10 train z3skip 2 "${Z3[@]}" --set check.replay_every=5 \
  --set check.on_corruption=skip
same z3skip z3base "skip under ZeRO-3: the uninjected run's weights"

# The check mode's negative control: caught at step 2, naming the rank.
"$LOCKSTEP_RUN" --nproc-per-node 2 --master-port 0 "$LOCKSTEP" check --config "$ROOT/configs/digits.yaml" \
  --inject grad-flip --steps 4 >"$WORK/check.out" 2>&1
expect_eq "$?" 1 "lockstep check --inject grad-flip: exit 1 (a fault caught is a FAIL)"
expect_grep "$WORK/check.out" "\\(b\\) DDP training, 4 steps +FAIL: silent data corruption: step 2: rank 1 .*check.replay_every" \
  "(b) names rank 1 at step 2"
"$LOCKSTEP_RUN" --nproc-per-node 2 --master-port 0 "$LOCKSTEP" check --config "$ROOT/configs/digits.yaml" \
  --inject act-flip --fault-rank 0 --steps 4 >"$WORK/check_act.out" 2>&1
expect_grep "$WORK/check_act.out" "FAIL: silent data corruption: step 2: rank 0 " "act-flip on rank 0 named"

# 5. Clean runs: nothing found, the weights of the same run without checks.
every=(--set check.grad_screen=true --set check.replay_every=1)
train clean3 3 "${every[@]}"
same clean3 base3 "3 ranks, screen and replay every step: nothing found, same weights"
train z2clean 2 "${Z2[@]}" "${every[@]}"
same z2clean z2base "ZeRO-2, bf16, accumulation: nothing found, same weights"
train psgd 2 --set ddp.comm_hook=powersgd --set ddp.powersgd.start_iter=2 "${every[@]}"
expect_eq "$?" 0 "PowerSGD: nothing found"
train fp16 2 --set train.precision=fp16 "${every[@]}"
code=$?
if [ "$code" = 2 ] && grep -q "float16 autocast on the CPU needs LibTorch 2.4" "$WORK/fp16.out"; then
  pass "fp16 with its GradScaler: not on this LibTorch's CPU (2.4 or later), nothing to check"
else
  expect_eq "$code" 0 "fp16 with its GradScaler: nothing found"
fi
finish
