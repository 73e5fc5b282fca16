#!/usr/bin/env bash
# PowerSGD (ddp.comm_hook: powersgd) on 2 ranks (docs/ddp.md):
# 1. the digits train to within 0.01 of the all-reduce run's accuracy while
#    exchanging at least 4x fewer bytes per step after start_iter
#    (comm_bytes_per_step in metrics.jsonl);
# 2. a run resumed from a checkpoint ends bit-identical to the uninterrupted
#    one (the hook's error buffers and Qs are in comm_hook.pt, which
#    torch.load reads);
# 3. against PyTorch's own powerSGD_hook (tests/python/powersgd_parity.py)
#    on the same model, data and settings, approximation ranks 1, 2 and 4,
#    and 2 with batch_tensors_with_same_shape: the same bytes per step and
#    bit-identical weights;
# 4. bad settings exit 2 naming the key.
#   powersgd.sh LOCKSTEP LOCKSTEP_RUN LOCKSTEP_TESTS
source "$(dirname "$0")/lib.sh"
TESTS=${3:?usage: $0 LOCKSTEP LOCKSTEP_RUN LOCKSTEP_TESTS}
root=$(cd "$(dirname "$0")/../.." && pwd)
runs=$RUNS
TRAIN_ARGS=(--set log.every=10 --set train.max_steps=200 --set optim.decay_steps=460)
export OMP_NUM_THREADS=1
accuracy() { grep -o "validation accuracy [0-9.]*" "$WORK/$1.out" | tail -1 | awk '{print $3}'; }
# Mean comm_bytes_per_step of the records from step $2 on.
bytes_from() {
  $PY -c "
import json, sys
rs = [json.loads(l) for l in open('$runs/$1/metrics.jsonl') if '\"comm_bytes_per_step\"' in l]
rs = [r['comm_bytes_per_step'] for r in rs if r['step'] >= $2]
print(int(sum(rs) / len(rs)) if rs else 0)"
}

# 1. Accuracy and bytes.
train plain 2
expect_eq "$?" 0 "the all-reduce run trains"
train psgd 2 --set ddp.comm_hook=powersgd --set ddp.powersgd.start_iter=10
expect_eq "$?" 0 "the PowerSGD run trains" || tail -5 "$WORK/psgd.out"
a=$(accuracy plain) b=$(accuracy psgd)
# Compression must not cost accuracy: at most 0.01 (4 of 359 examples)
# below all-reduce's; above it is noise of the other gradients, not a fault.
awk -v a="$a" -v b="$b" 'BEGIN{exit !(b != "" && b >= a - 0.01)}' &&
  pass "PowerSGD's validation accuracy $b is no more than 0.01 below all-reduce's $a" ||
  fail "PowerSGD's validation accuracy $b is more than 0.01 below all-reduce's $a"
pb=$(bytes_from plain 20) sb=$(bytes_from psgd 20) early=$(bytes_from psgd 0)
awk -v p="$pb" -v s="$sb" 'BEGIN{exit !(s > 0 && p >= 4 * s)}' &&
  pass "after start_iter PowerSGD sends $sb bytes per step, all-reduce $pb (>= 4x fewer)" ||
  fail "PowerSGD sends $sb bytes per step after start_iter, all-reduce $pb: not 4x fewer"
first=$($PY -c "
import json
print([json.loads(l) for l in open('$runs/psgd/metrics.jsonl') if '\"comm_bytes_per_step\"' in l][0]['comm_bytes_per_step'])")
expect_eq "$first" "$pb" "before start_iter it all-reduces plainly (the first 10 steps: $first bytes each)"

# 2. Resume: interrupted at step 100 (a checkpoint every 50), resumed, bit-identical.
train whole 2 --set ddp.comm_hook=powersgd --set ddp.powersgd.start_iter=10 --set ddp.powersgd.rank=2 \
  --set checkpoint.every=50
expect_eq "$?" 0 "a PowerSGD run with checkpoints"
expect_grep "$runs/whole/checkpoints/step_00000100/MANIFEST" "  comm_hook.pt$" "the checkpoint holds comm_hook.pt in its MANIFEST"
train resumed 2 --set ddp.comm_hook=powersgd --set ddp.powersgd.start_iter=10 --set ddp.powersgd.rank=2 \
  --set checkpoint.every=50 --set checkpoint.resume="$runs/whole/checkpoints/step_00000100"
expect_eq "$?" 0 "the resumed run" || tail -5 "$WORK/resumed.out"
expect_grep "$WORK/resumed.out" "resumed from .*step_00000100 at step 100" "it resumed at step 100"
$PY -c "
import torch
a = torch.load('$runs/whole/checkpoints/step_00000200/model.pt')
b = torch.load('$runs/resumed/checkpoints/step_00000200/model.pt')
h = torch.load('$runs/whole/checkpoints/step_00000100/comm_hook.pt')
assert all(torch.equal(a[k], b[k]) for k in a), 'weights differ'
assert {'rank0.iter', 'rank1.iter', 'rank0.error.0', 'rank1.q.0'} <= set(h), sorted(h)
assert int(h['rank0.iter']) == 100, int(h['rank0.iter'])
assert not torch.equal(h['rank0.error.0'], h['rank1.error.0']), 'each rank keeps its own error'
assert torch.equal(h['rank0.q.0'], h['rank1.q.0']), 'Q is shared'
" 2>"$WORK/py.err" && pass "the resumed run ends bit-identical; comm_hook.pt holds each rank's error, one Q, iter 100" ||
  { fail "resume is not bit-identical, or comm_hook.pt is not as documented"; tail -3 "$WORK/py.err"; }
# 2a. A hostile comm_hook.pt (its MANIFEST line rewritten to match): ranks
#     that disagree on a shared entry, and a truncated file; each is exit 2
#     naming the file, on every rank, never a crash or a hang.
hostile() {  # hostile NAME PYTHON-THAT-REWRITES-$f
  local ck="$WORK/$1"
  rm -rf "$ck" && cp -r "$runs/whole/checkpoints/step_00000100" "$ck"
  f="$ck/comm_hook.pt" $PY -c "import os, torch; f = os.environ['f']; $2" &&
    $PY -c "
import hashlib, sys
ck = sys.argv[1]
lines = open(ck + '/MANIFEST').read().splitlines()
h = hashlib.sha256(open(ck + '/comm_hook.pt', 'rb').read()).hexdigest()
open(ck + '/MANIFEST', 'w').write(''.join((h + '  comm_hook.pt' if l.endswith('  comm_hook.pt') else l) + '\n' for l in lines))
" "$ck"
  train "$1" 2 --set ddp.comm_hook=powersgd --set ddp.powersgd.start_iter=10 --set ddp.powersgd.rank=2 \
    --set checkpoint.resume="$ck"
}
hostile bad-iter "s = torch.load(f); s['rank1.iter'] = torch.tensor(5); torch.save(s, f)"
expect_eq "$?" 2 "a comm_hook.pt whose ranks disagree on iter exits 2"
expect_grep "$WORK/bad-iter.out" "\[rank1\]: .*comm_hook.pt: 'iter' differs between rank 0 and rank 1" "rank 1 names the entry"
expect_grep "$WORK/bad-iter.out" "\[rank0\]: .*comm_hook.pt: 'iter' differs between rank 0 and rank 1" "and so does rank 0"
hostile truncated "b = open(f, 'rb').read(); open(f, 'wb').write(b[:len(b) // 2])"
expect_eq "$?" 2 "a truncated comm_hook.pt exits 2"
expect_grep "$WORK/truncated.out" "comm_hook.pt" "naming the file"

# 2b. The same with a small GPT: its LayerNorms' gradients arrive weight
#     first, so a resumed DDP must take the saved bucket order (Note
#     [Restored bucket order]) for the state to fit its buckets.
gpt() {  # gpt NAME ARGS...
  local name=$1
  shift
  "$LOCKSTEP_RUN" --nproc-per-node 2 --master-port 0 "$LOCKSTEP" train \
    --config "$root/configs/gpt-text.yaml" --set run.dir="$runs" --set run.name="$name" \
    --set log.progress=plain --set model.n_layer=1 --set model.n_embd=32 --set model.n_head=2 \
    --set model.block_size=32 --set train.max_steps=24 --set checkpoint.every=12 \
    --set ddp.comm_hook=powersgd --set ddp.powersgd.start_iter=4 "$@" >"$WORK/$name.out" 2>&1
}
gpt gpt-whole
expect_eq "$?" 0 "a small GPT with PowerSGD" || tail -5 "$WORK/gpt-whole.out"
gpt gpt-resumed --set checkpoint.resume="$runs/gpt-whole/checkpoints/step_00000012"
expect_eq "$?" 0 "resumed at step 12" || tail -5 "$WORK/gpt-resumed.out"
if grep -q "holds other parameters" "$WORK/gpt-resumed.out"; then
  fail "the resumed GPT's buckets hold other parameters than the saved state"
else
  pass "the resumed GPT's buckets hold the parameters the saved state was made for"
fi
$PY -c "
import torch
a = torch.load('$runs/gpt-whole/checkpoints/step_00000024/model.pt')
b = torch.load('$runs/gpt-resumed/checkpoints/step_00000024/model.pt')
assert all(torch.equal(a[k], b[k]) for k in a), 'weights differ'
" 2>"$WORK/py.err" && pass "the resumed GPT ends bit-identical" || { fail "the resumed GPT differs"; tail -3 "$WORK/py.err"; }
# From step 1, before DDP's one-time bucket rebuild: no order is saved, and
# the resumed run rebuilds as the uninterrupted one did.
gpt gpt-every --set checkpoint.every=1 --set checkpoint.keep=30
expect_eq "$?" 0 "the small GPT with a checkpoint at every step"
gpt gpt-from1 --set checkpoint.resume="$runs/gpt-every/checkpoints/step_00000001"
expect_eq "$?" 0 "resumed at step 1" || tail -5 "$WORK/gpt-from1.out"
$PY -c "
import torch
a = torch.load('$runs/gpt-whole/checkpoints/step_00000024/model.pt')
b = torch.load('$runs/gpt-from1/checkpoints/step_00000024/model.pt')
h = torch.load('$runs/gpt-every/checkpoints/step_00000001/comm_hook.pt')
assert 'ddp.bucket_order' not in h, 'an order saved before the rebuild'
assert 'ddp.bucket_order' in torch.load('$runs/gpt-every/checkpoints/step_00000002/comm_hook.pt')
assert all(torch.equal(a[k], b[k]) for k in a), 'weights differ'
" 2>"$WORK/py.err" && pass "resumed from step 1 (no bucket order yet), it ends bit-identical too" ||
  { fail "the GPT resumed from step 1 differs"; tail -3 "$WORK/py.err"; }

# Resumed with the hook gone: a note, and it trains on.
train dropped 2 --set checkpoint.resume="$runs/whole/checkpoints/step_00000100"
expect_eq "$?" 0 "resumed with ddp.comm_hook: allreduce"
expect_grep "$WORK/dropped.out" "keeps none: ignored" "and says the saved hook state is not used"

# 3. PyTorch's own hook on the same run.
$PY "$root/tests/python/powersgd_parity.py" prepare "$WORK" 2>"$WORK/py.err"
expect_eq "$?" 0 "the parity run's data" || tail -3 "$WORK/py.err"
for r in r1 r2 r4 r2-batch; do
  $PY "$root/tests/python/powersgd_parity.py" torch "$WORK" "$r" >"$WORK/torch$r.out" 2>&1
  expect_eq "$?" 0 "PyTorch's DDP with powerSGD_hook, $r" || tail -5 "$WORK/torch$r.out"
done
LOCKSTEP_POWERSGD_PARITY="$WORK" "$TESTS" "[.powersgd_parity]" >"$WORK/tests.out" 2>&1
expect_eq "$?" 0 "lockstep's side of the parity run" || tail -20 "$WORK/tests.out"
for r in r1 r2 r4 r2-batch; do
  line=$($PY "$root/tests/python/powersgd_parity.py" compare "$WORK" "$r" 2>&1)
  [ $? = 0 ] && pass "against PyTorch: $line" || fail "against PyTorch: $line"
done

# 4. Bad settings.
train bad 2 --set ddp.comm_hook=powersgd --set ddp.powersgd.start_iter=1
expect_eq "$?" 2 "start_iter 1 with error feedback exits 2"
expect_grep "$WORK/bad.out" "ddp.powersgd.start_iter: must be at least 2 with error_feedback" "naming the key"
train unknown 2 --set ddp.comm_hook=powersgdd
expect_eq "$?" 2 "an unknown hook exits 2"
expect_grep "$WORK/unknown.out" "ddp.comm_hook: unknown hook 'powersgdd' \(valid: allreduce, fp16, bf16, powersgd;" "listing the valid ones"

finish
