#!/usr/bin/env bash
# Synchronised batch normalisation (model.sync_batchnorm, model/sync_batchnorm.h):
# 1. against PyTorch's own SyncBatchNorm autograd function (the Python peer,
#    tests/python/sync_batchnorm_peer.py) on the same batches, 2 ranks with
#    uneven batches and 3 with an empty one: outputs, input, weight and bias
#    gradients and running statistics within 1e-12 (double);
# 2. the closed form end to end: a 2-rank ResNet run with 16 images per rank
#    ends with the validation loss of a 1-rank run with 32 (the same global
#    batches: the sampler deals rank r the r-th of every W indices) to
#    1e-4, and without synchronisation it does not;
# 3. the every-step check covers the running statistics (buffers) and the
#    check mode passes with them; ZeRO-3 and bf16 run with it;
# 4. model.sync_batchnorm on a model without BatchNorm, and with the replay
#    (a rank's gradient depends on every rank's batch): exit 2 naming the keys.
#   sync_batchnorm.sh LOCKSTEP LOCKSTEP_RUN LOCKSTEP_TESTS
source "$(dirname "$0")/lib.sh"
TESTS=${3:?usage: $0 LOCKSTEP LOCKSTEP_RUN LOCKSTEP_TESTS}
root=$(cd "$(dirname "$0")/../.." && pwd)
export OMP_NUM_THREADS=1

# 1. PyTorch's SyncBatchNorm.
for rows in 5,3 4,0,3; do
  dir="$WORK/peer-$rows"
  mkdir -p "$dir"
  if ! $PY "$root/tests/python/sync_batchnorm_peer.py" prepare "$dir" "$rows" >"$dir/log" 2>&1 ||
    ! timeout 120 $PY "$root/tests/python/sync_batchnorm_peer.py" torch "$dir" >>"$dir/log" 2>&1; then
    fail "rows $rows: PyTorch's SyncBatchNorm did not run"
    tail -20 "$dir/log"
    continue
  fi
  LOCKSTEP_SYNC_BN_PEER="$dir" "$TESTS" "[.sync_bn_peer]" >>"$dir/log" 2>&1 ||
    { fail "rows $rows: lockstep's run"; tail -20 "$dir/log"; continue; }
  if out=$($PY "$root/tests/python/sync_batchnorm_peer.py" compare "$dir" 1e-12 2>&1); then
    pass "PyTorch's SyncBatchNorm, $out"
  else
    fail "PyTorch's SyncBatchNorm, rows $rows: $out"
  fi
done

# 2. The closed form: 2 ranks x 16 synchronised = 1 rank x 32.
TRAIN_ARGS=(--set model.name=resnet --set model.depth=10 --set model.width=4 --set train.max_steps=30
  --set checkpoint.every=0 --set optim.warmup_steps=0)
loss() { grep -o "validation accuracy [0-9.]*, loss [0-9.]*" "$WORK/$1.out" | tail -1 | awk '{print $5}'; }
train one 1 --set data.batch_size=32
train synced 2 --set data.batch_size=16 --set model.sync_batchnorm=true --set check.every=1
expect_eq "$?" 0 "2 ranks, synchronised, the every-step check on the running statistics too"
train local 2 --set data.batch_size=16
a=$(loss one) b=$(loss synced) c=$(loss local)
rel() { awk -v a="$1" -v b="$2" 'BEGIN{d=(a-b)/b; if (d<0) d=-d; printf "%.3g", d}'; }
if [ -n "$a" ] && [ -n "$b" ] && [ -n "$c" ]; then
  expect_lt "$(rel "$b" "$a")" 1e-4 "synchronised, 2 x 16: the validation loss of 1 x 32 ($b against $a)"
  expect_lt 1e-3 "$(rel "$c" "$a")" "... and unsynchronised it is not ($c)"
else
  fail "the runs' losses: one '$a', synced '$b', local '$c'"
fi

# 3. The check mode, ZeRO-3, bf16.
"$LOCKSTEP_RUN" --nproc-per-node 2 --master-port 0 "$LOCKSTEP" check --config "$ROOT/configs/digits.yaml" \
  --set model.name=resnet --set model.depth=10 --set model.width=4 --set model.sync_batchnorm=true \
  --set run.dir="$RUNS" >"$WORK/check.out" 2>&1
expect_eq "$?" 0 "lockstep check with synchronised batch normalisation passes"
train z3 2 --set model.sync_batchnorm=true --set optim.zero=3 --set train.precision=bf16 \
  --set train.max_steps=10
expect_eq "$?" 0 "ZeRO-3 with bf16 and synchronised batch normalisation trains"

# 4. Nothing to synchronise.
TRAIN_ARGS=(--set train.max_steps=5)
train mlp 2 --set model.sync_batchnorm=true
expect_eq "$?" 2 "model.sync_batchnorm on an MLP: exit 2"
expect_grep "$WORK/mlp.out" "model.sync_batchnorm: true.*has no batch normalisation" "naming the key"
train replay 2 --set model.sync_batchnorm=true --set model.name=cnn --set model.batch_norm=true \
  --set check.replay_every=2
expect_eq "$?" 2 "check.replay_every with model.sync_batchnorm: exit 2"
expect_grep "$WORK/replay.out" "check.replay_every.*model.sync_batchnorm" "naming both keys"
finish
