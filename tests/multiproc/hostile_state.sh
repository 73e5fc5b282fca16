#!/usr/bin/env bash
# Nothing silently wrong (docs/failure-modes.md, docs/checkpoints.md):
# checkpoints read as hostile input, training that diverges, token files
# that change under a job, resuming against other data, the run directory
# of another run, the epoch's tail under accumulation, a resumed run that
# had finished. Each case names what was wrong and exits alike on every
# rank; ranks are started without the launcher where every rank's own exit
# code is the point.
source "$(dirname "$0")/lib.sh"
root=$(cd "$(dirname "$0")/../.." && pwd)
runs="$WORK/runs"
export OMP_NUM_THREADS=1
digits=(--config "$root/configs/digits.yaml" --set run.dir="$runs" --set log.progress=plain
        --set train.max_steps=20 --set checkpoint.every=10)
ranks() {  # ranks OUT ARGS...: 2 ranks started by hand; "$WORK/OUT.codes" gets "c0 c1"
  local out=$1
  shift
  by_hand "$out" 2 train "$@"
}
# copy_tampered SOURCE NAME FILE PYTHON: a copy of checkpoint SOURCE as
# $WORK/NAME with FILE rewritten by PYTHON (f: its path) and its MANIFEST
# line made to match, as a hostile editor would.
copy_tampered() {
  local ck="$WORK/$2"
  rm -rf "$ck" && cp -r "$1" "$ck"
  f="$ck/$3" $PY -c "import os, torch; f = os.environ['f']; $4" &&
    $PY - "$ck" "$3" <<'PY'
import hashlib, sys
ck, name = sys.argv[1], sys.argv[2]
lines = open(ck + '/MANIFEST').read().splitlines()
h = hashlib.sha256(open(ck + '/' + name, 'rb').read()).hexdigest()
open(ck + '/MANIFEST', 'w').write(''.join((h + '  ' + name if l.endswith('  ' + name) else l) + '\n' for l in lines))
PY
}
tamper() { copy_tampered "$runs/base/checkpoints/step_00000020" "$@"; }  # tamper NAME FILE PYTHON

# 1. Checkpoint values: every rank exits 2 naming the file and the entry,
#    whichever rank owns it under ZeRO (layers.0.weight: rank 1's).
train base 2 "${digits[@]}" --set run.name=base --set optim.name=adam --set optim.lr=0.01
expect_eq "$?" 0 "a 20-step Adam run on 2 ranks (the base checkpoint)"
tamper nan optimizer.pt "s = torch.load(f); s['layers.0.weight.exp_avg'][3, 4] = float('nan'); torch.save(s, f)"
for z in 0 1 2; do
  ranks nan$z "${digits[@]}" --set run.name=nan$z --set optim.name=adam --set optim.zero=$z \
    --set checkpoint.resume="$WORK/nan"
  expect_eq "$(cat "$WORK/nan$z.codes")" "2 2" "a NaN exp_avg in optimizer.pt, optim.zero $z: exit 2 on both ranks"
  for r in 0 1; do
    expect_grep "$WORK/nan$z.$r" "optimizer.pt: entry 'layers.0.weight.exp_avg' is not finite: element 196 is nan" "rank $r names the file, the entry and the element"
  done
done
tamper negative optimizer.pt "s = torch.load(f); s['layers.2.weight.exp_avg_sq'][0, 0] = -1.0; torch.save(s, f)"
ranks negative "${digits[@]}" --set run.name=negative --set optim.name=adam --set optim.zero=1 \
  --set checkpoint.resume="$WORK/negative"
expect_eq "$(cat "$WORK/negative.codes")" "2 2" "a negative exp_avg_sq: exit 2 on both ranks"
expect_grep "$WORK/negative.1" "'layers.2.weight.exp_avg_sq' is a second moment and cannot be negative" "naming the rule"
tamper nanweight model.pt "s = torch.load(f); s['layers.2.bias'][1] = float('inf'); torch.save(s, f)"
train nanweight 2 "${digits[@]}" --set run.name=nanweight --set optim.name=adam --set checkpoint.resume="$WORK/nanweight"
expect_eq "$?" 2 "an inf weight in model.pt: exit 2"
expect_grep "$WORK/nanweight.out" "model.pt: entry 'layers.2.bias' is not finite" "naming it"
tamper norng rng.pt "torch.save(torch.zeros(0, 5056, dtype=torch.uint8), f)"
train norng 2 "${digits[@]}" --set run.name=norng --set optim.name=adam --set checkpoint.resume="$WORK/norng"
expect_eq "$?" 2 "an rng.pt of 0 rows: exit 2 (was: silently reseeded)"
expect_grep "$WORK/norng.out" "rng.pt: holds 0 generator state\(s\)" "naming rng.pt"
tamper badrng rng.pt "torch.save(torch.zeros(2, 17, dtype=torch.uint8), f)"
train badrng 2 "${digits[@]}" --set run.name=badrng --set optim.name=adam --set checkpoint.resume="$WORK/badrng"
expect_eq "$?" 2 "an rng.pt of the wrong state size: exit 2 (was: exit 4)"
expect_grep "$WORK/badrng.out" "rng.pt: holds 2 generator state\(s\) of 17 bytes" "naming rng.pt and the sizes"

# 2. PowerSGD's comm_hook.pt: 1e38 in rank 1's error, a NaN Q equal on
#    every rank (refused for what it is, not as "differs").
train psgd 2 "${digits[@]}" --set run.name=psgd --set ddp.comm_hook=powersgd \
  --set ddp.powersgd.start_iter=2 --set checkpoint.every=20
expect_eq "$?" 0 "a PowerSGD run"
psgd_tamper() { copy_tampered "$runs/psgd/checkpoints/step_00000020" "$1" comm_hook.pt "$2"; }
psgd_tamper huge "s = torch.load(f); s['rank1.error.0'][0] = 1e38; torch.save(s, f)"
ranks huge "${digits[@]}" --set run.name=huge --set ddp.comm_hook=powersgd --set ddp.powersgd.start_iter=2 \
  --set checkpoint.resume="$WORK/huge"
expect_eq "$(cat "$WORK/huge.codes")" "2 2" "1e38 in rank 1's PowerSGD error: exit 2 on both ranks"
expect_grep "$WORK/huge.0" "comm_hook.pt: entry 'rank1.error.0' is out of range" "rank 0 names rank 1's entry"
psgd_tamper nanq "s = torch.load(f); k = [k for k in s if '.q.' in k or k.startswith('q.')][0]; s[k].view(-1)[0] = float('nan'); torch.save(s, f)"
train nanq 2 "${digits[@]}" --set run.name=nanq --set ddp.comm_hook=powersgd --set ddp.powersgd.start_iter=2 \
  --set checkpoint.resume="$WORK/nanq"
expect_eq "$?" 2 "a NaN Q: exit 2"
expect_grep "$WORK/nanq.out" "comm_hook.pt: entry '[^']*q[^']*' is not finite" "refused as not finite"
if grep -q "differs between rank 0" "$WORK/nanq.out"; then fail "a NaN Q equal on every rank reported as differing"; else pass "not as differing between ranks"; fi

# 3. Training that diverges stops every rank at that step, with no
#    checkpoint of that state; train.stop_on_nonfinite: false trains on.
ranks diverged "${digits[@]}" --set run.name=diverged --set optim.lr=1000000 --set checkpoint.every=1
expect_eq "$(cat "$WORK/diverged.codes")" "1 1" "optim.lr 1e6: exit 1 on both ranks"
step=$(sed -n 's/.*training diverged at step \([0-9]*\):.*/\1/p' "$WORK/diverged.0" | head -1)
[ -n "$step" ] && pass "'training diverged at step $step'" || fail "no 'training diverged at step N' on rank 0"
expect_grep "$WORK/diverged.1" "training diverged at step $step: " "rank 1 stops at the same step"
newest=$(ls "$runs/diverged/checkpoints" | sort | tail -1)
expect_eq "$newest" "$(printf 'step_%08d' $((step - 1)))" "the newest checkpoint is the step before it"
train trained_on 2 "${digits[@]}" --set run.name=trained_on --set optim.lr=1000000 --set train.stop_on_nonfinite=false
expect_eq "$?" 0 "with train.stop_on_nonfinite: false it trains on (exit 0)"

# 4. The run directory of another run: refused, unless run.overwrite.
train again 2 "${digits[@]}" --set run.name=base --set optim.name=adam --set optim.lr=0.01
expect_eq "$?" 2 "a fresh run into a run directory with another run's results: exit 2"
expect_grep "$WORK/again.out" "run directory '.*/base' holds another run's results \(checkpoints, metrics.jsonl\).*checkpoint.resume: auto.*run.name.*run.overwrite: true" "naming them and the three ways on"
before=$(wc -l <"$runs/base/metrics.jsonl")
train over 2 "${digits[@]}" --set run.name=base --set optim.name=adam --set optim.lr=0.01 --set run.overwrite=true
expect_eq "$?" 0 "with run.overwrite: true it runs"
moved=$(ls -d "$runs/base"/overwritten-* | head -1)
expect_eq "$(wc -l <"$moved/metrics.jsonl")" "$before" "the old metrics.jsonl is kept in $(basename "$moved")/"
expect_eq "$(grep -c '"step": 20, "epoch": 1, "loss"' "$runs/base/metrics.jsonl")" 1 "the new metrics.jsonl has step 20's record once"
expect_eq "$(ls "$runs/base/checkpoints")" "$(printf 'step_00000010\nstep_00000020')" "and the new run's own checkpoints"

# 5. A resumed run that had finished reports its validation.
train finished 2 "${digits[@]}" --set run.name=base --set optim.name=adam --set optim.lr=0.01 --set checkpoint.resume=auto
expect_eq "$?" 0 "resuming a finished run"
expect_grep "$WORK/finished.out" "done: 20 steps, validation accuracy 0\.[0-9]+" "reports its validation accuracy"
if grep -q "no validation (empty split)" "$WORK/finished.out"; then fail "says 'no validation (empty split)'"; else pass "not 'no validation (empty split)'"; fi

# 6. The epoch's tail under accumulation (Note [Epoch tail]): 203 rows on
#    2 ranks, batch 8, accumulation 2: 7 steps an epoch, every row trained.
$PY -c "
import random
random.seed(1)
print('\n'.join(','.join(f'{random.random():.4f}' for _ in range(4)) + ',' + str(random.randrange(3)) for _ in range(203)))
" >"$WORK/rows.csv"
train tail 2 --config "$root/configs/digits.yaml" --set run.dir="$runs" --set run.name=tail \
  --set data.name=csv --set data.path="$WORK/rows.csv" --set data.validation_fraction=0 \
  --set data.batch_size=8 --set train.accumulation_steps=2 --set train.epochs=2 --set log.every=1 --set log.progress=plain
expect_eq "$?" 0 "203 rows, 2 ranks, batch 8, accumulation 2"
expect_grep "$WORK/tail.out" "203 train, 0 validation examples\); global batch 32 = 8 per rank x 2 ranks x 2 accumulation; 7 steps per epoch" "7 steps per epoch (was 6: 11 rows never trained)"
expect_grep "$WORK/tail.out" "trained 14 steps" "14 steps in 2 epochs"

# 7. Token data: llm.c's uint32 files read as such; another magic refused;
#    a file that shrinks under the job is an error naming it on every rank;
#    resuming against other data is refused unless allowed.
$PY - "$WORK" <<'PY'
import random, struct, sys
random.seed(0)
toks = [random.randrange(1000) for _ in range(50000)]
head = [0] * 256
head[0], head[1], head[2] = 20240801, 7, len(toks)
open(sys.argv[1] + '/v7.bin', 'wb').write(struct.pack('<256i', *head) + struct.pack('<%dI' % len(toks), *toks))
head[0] = 20240999
open(sys.argv[1] + '/unknown.bin', 'wb').write(struct.pack('<256i', *head) + struct.pack('<%dI' % len(toks), *toks))
head[0], head[2] = 20240801, 20000
open(sys.argv[1] + '/v7cut.bin', 'wb').write(struct.pack('<256i', *head) + struct.pack('<20000I', *toks[:20000]))
big = [random.randrange(1000) for _ in range(400000)]
open(sys.argv[1] + '/big.bin', 'wb').write(struct.pack('<%dH' % len(big), *big))
PY
gpt=(--config "$root/configs/gpt-text.yaml" --set run.dir="$runs" --set model.n_layer=1 --set model.n_head=2
     --set model.n_embd=16 --set model.block_size=32 --set data.name=tokens --set data.vocab_size=1000
     --set log.progress=plain --set check.every=0)
train v7 2 "${gpt[@]}" --set run.name=v7 --set data.path="$WORK/v7.bin" --set train.max_steps=2
expect_eq "$?" 0 "an llm.c version-7 file (uint32 tokens) trains"
expect_grep "$WORK/v7.out" "data: tokens \(50,000 tokens in" "as 50,000 tokens (was: 100,512 uint16)"
train unknown 2 "${gpt[@]}" --set run.name=unknown --set data.path="$WORK/unknown.bin" --set train.max_steps=2
expect_eq "$?" 2 "an llm.c-style header of unknown magic: exit 2"
expect_grep "$WORK/unknown.out" "magic 20240999 and version 7, which lockstep does not know \(known: llm.c's magic 20240520" "listing the known formats"
train shrunk 2 "${gpt[@]}" --set run.name=shrunk --set data.path="$WORK/big.bin" \
  --set train.max_steps=1000000 --set train.epochs=1000 --set checkpoint.every=0 &
job=$!
wait_for 120 "step 25 of the job whose file is cut" grep -q "step 25" "$WORK/shrunk.out"
truncate -s 1000 "$WORK/big.bin"
wait "$job"
expect_eq "$?" 2 "a token file cut under a running job: exit 2 (was: SIGBUS, exit 135)"
# Each rank checks at its next batch; one already waiting in a collective
# is stopped by lockstep-run, whose summary names the file.
expect_grep "$WORK/shrunk.out" "^\[rank[01]\]: .*token file '$WORK/big.bin' changed under the running job: its size changed from 800000 to 1000 bytes" "a rank names the file and the sizes"
expect_grep "$WORK/shrunk.out" "^    .*token file '$WORK/big.bin' changed under the running job" "and so does the root cause in lockstep-run's summary"
if grep -q "signal 7" "$WORK/shrunk.out"; then fail "a rank died of SIGBUS"; else pass "no rank died of a signal"; fi
train recut 2 "${gpt[@]}" --set run.name=v7 --set data.path="$WORK/v7cut.bin" --set train.max_steps=4 --set checkpoint.resume=auto
expect_eq "$?" 2 "resuming against a data set of another size: exit 2"
expect_grep "$WORK/recut.out" "was trained on 1406 training examples \(data_id [0-9a-f]+\), the training split now has 562" "naming both sizes"
train recut_ok 2 "${gpt[@]}" --set run.name=v7 --set data.path="$WORK/v7cut.bin" --set train.max_steps=4 \
  --set checkpoint.resume=auto --set checkpoint.allow_data_change=true
expect_eq "$?" 0 "with checkpoint.allow_data_change: true it resumes"
expect_grep "$WORK/recut_ok.out" "\[warning\] checkpoint .* was trained on 1406 .*re-mapped onto the new data" "with a warning"
expect_grep "$WORK/recut_ok.out" "trained 4 steps" "and trains to step 4"

# 8. generate: a checkpoint's shapes checked against its config before
#    anything is built; tiny temperatures greedy; options refused before
#    any output; an overflowing --prompt-tokens refused.
head -c 20000 "$root/data/kjv.txt" >"$WORK/book.txt"
train gptrun 2 --config "$root/configs/gpt-text.yaml" --set run.dir="$runs" --set run.name=gen \
  --set model.n_layer=1 --set model.n_head=2 --set model.n_embd=16 --set model.block_size=32 \
  --set data.path="$WORK/book.txt" --set train.max_steps=3 --set check.every=0 --set log.progress=plain
expect_eq "$?" 0 "a small GPT checkpoint"
gck="$runs/gen/checkpoints/step_00000003"
gen_tamper() { copy_tampered "$gck" "$@"; }  # gen_tamper NAME FILE PYTHON
peak_generate() {  # peak_generate OUT ARGS...: exit code, then the peak RSS in MiB
  $PY - "$WORK/$1" "$LOCKSTEP" generate "${@:2}" <<'PY'
import resource, subprocess, sys
with open(sys.argv[1], 'w') as out:
    code = subprocess.call(sys.argv[2:], stdout=out, stderr=subprocess.STDOUT)
print(code, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024)
PY
}
gen_tamper huge config.yaml "t = open(f).read().replace('n_embd: 16', 'n_embd: 4096').replace('block_size: 32', 'block_size: 131072'); open(f, 'w').write(t)"
# The bound is against the untampered checkpoint's own peak: a LibTorch with
# CUDA (pip's) holds ~400 MiB before it reads a byte.
read -r _ base < <(peak_generate small.out --checkpoint "$gck" --prompt "In the" --max-new-tokens 1)
read -r code mib < <(peak_generate huge.out --checkpoint "$WORK/huge" --prompt "In the")
expect_eq "$code" 2 "a config.yaml edited to n_embd 4096, block_size 131072: exit 2"
expect_lt "$mib" $((base + 100)) "within $mib MiB, the untampered checkpoint's $base MiB + 100 (was: 2981 MiB before the shape error)"
expect_grep "$WORK/huge.out" "model.pt's 'transformer.wte.weight' is \[256, 16\], its config.yaml's model \(block_size 131072, n_embd 4096\) needs \[256, 4096\]" "naming the entry and both shapes"
gen_tamper wide model.pt "s = torch.load(f); s['transformer.wte.weight'] = torch.zeros(2**31, 0); torch.save(s, f)"
read -r code mib < <(peak_generate wide.out --checkpoint "$WORK/wide" --prompt "In the")
expect_eq "$code" 2 "a transformer.wte.weight of shape [2^31, 0]: exit 2 (was: exit 4)"
expect_grep "$WORK/wide.out" "transformer.wte.weight has 2147483648 rows" "naming it"
"$LOCKSTEP" generate --checkpoint "$gck" --prompt "In the" --temperature 0 --max-new-tokens 20 >"$WORK/greedy.out" 2>&1
expect_eq "$?" 0 "greedy generation"
"$LOCKSTEP" generate --checkpoint "$gck" --prompt "In the" --temperature 1e-300 --max-new-tokens 20 >"$WORK/tiny.out" 2>&1
expect_eq "$?" 0 "--temperature 1e-300 (was: exit 4, 'probability tensor contains inf, nan')"
expect_eq "$(cat "$WORK/tiny.out")" "$(cat "$WORK/greedy.out")" "and it samples greedily"
"$LOCKSTEP" generate --checkpoint "$gck" --prompt "In the" --top-k -1 >"$WORK/refused.out" 2>"$WORK/refused.err"
expect_eq "$?" 2 "--top-k -1: exit 2"
expect_eq "$(stat -c %s "$WORK/refused.out")" 0 "and nothing on stdout (was: the prompt)"
"$LOCKSTEP" generate --checkpoint "$runs/v7" --prompt-tokens 99999999999999999999999 >"$WORK/big.out" 2>&1
expect_eq "$?" 2 "--prompt-tokens 99999999999999999999999: exit 2 (was: read as 2^63 - 1)"
expect_grep "$WORK/big.out" "--prompt-tokens: '99999999999999999999999' is not a token id" "naming it"

# 9. The root cause is the first failure in time (Note [Root cause]): two
#    jobs on one port. Job B's rank 0 cannot bind ("Address already in
#    use"), its rank 1 meets job A's store and fails its handshake; which
#    comes first depends on start-up, and the summary names that one, both
#    messages saying what is wrong: another job on MASTER_PORT.
port=$(free_port)
"$LOCKSTEP_RUN" --nproc-per-node 2 --master-port "$port" "$LOCKSTEP" train "${digits[@]}" --set run.name=jobA \
  --set train.max_steps=100000 --set train.epochs=100000 --set checkpoint.every=0 >"$WORK/jobA.out" 2>&1 &
jobA=$!
wait_for 120 "job A's step 20" grep -q "step 20" "$WORK/jobA.out"
for try in 1 2 3; do
  "$LOCKSTEP_RUN" --nproc-per-node 2 --master-port "$port" "$LOCKSTEP" train "${digits[@]}" --set run.name=jobB$try \
    >"$WORK/jobB$try.out" 2>&1
  expect_eq "$?" 2 "job B ($try of 3) on job A's port: exit 2 (the bind failure was exit 3)"
  # The earliest by the workers' own timestamps, a tie to the lower rank (as
  # the launcher decides): not the first relayed, since one poll can bring
  # both ranks' lines, relayed in rank order.
  first=$(grep -E '^\[rank[0-9]\]: \[[^]]*\].* \[error\] lockstep ' "$WORK/jobB$try.out" |
    sed -E 's/^\[rank([0-9])\]: \[([^ ]*) ([^]]*)\].*/\2T\3 \1/' | awk '!seen[$2]++' |
    sort -k1,1 -k2,2n | head -1 | cut -d' ' -f2)
  expect_grep "$WORK/jobB$try.out" "root cause: rank $first " "its root cause is rank $first, whose error came first"
  expect_grep "$WORK/jobB$try.out" "^    \[.*\] \[error\] .*another job using MASTER_PORT\?" "and says another job holds MASTER_PORT"
done
kill -0 "$jobA" 2>/dev/null && pass "job A is unharmed" || fail "job A died"
kill -TERM "$jobA"
wait "$jobA"

# 10. What a killed writer left is repaired at the next start: best/ put
#     back from the copy aside, stale temporary folders removed.
train best 2 "${digits[@]}" --set run.name=best --set checkpoint.keep_best=val_loss --set train.eval_every=5
expect_eq "$?" 0 "a run that keeps its best checkpoint"
ckd="$runs/best/checkpoints"
mv "$ckd/best" "$ckd/.old-best-99999999"
mkdir "$ckd/.tmp-best-99999998" "$ckd/.tmp-step_00000030-99999997"
train best2 2 "${digits[@]}" --set run.name=best --set checkpoint.keep_best=val_loss --set train.eval_every=5 \
  --set checkpoint.resume=auto --set train.max_steps=25
expect_eq "$?" 0 "the next start"
expect_grep "$WORK/best2.out" "checkpoints: restored .*/checkpoints/best from .*\.old-best-99999999" "says it restored best/"
[ -f "$ckd/best/MANIFEST" ] && pass "best/ exists again" || fail "no best/"
expect_eq "$(ls -a "$ckd" | grep -c '^\.')" 2 "no .tmp-* or .old-* folder is left (only . and ..)"

# 11. A restarted attempt of a run without checkpoint.resume starts over:
#     the earlier attempt's results are moved aside, not refused.
LOCKSTEP_FAULT=crash:rank=1:step=15:attempt=0 "$LOCKSTEP_RUN" --nproc-per-node 2 --master-port 0 \
  --max-restarts 1 "$LOCKSTEP" train "${digits[@]}" --set run.name=restarted >"$WORK/restarted.out" 2>&1
expect_eq "$?" 0 "a fresh run restarted by lockstep-run --max-restarts finishes"
expect_grep "$WORK/restarted.out" "an earlier attempt of this job left results .*this attempt has no checkpoint.resume: it starts over from step 0" "saying it starts over"
ls -d "$runs/restarted"/overwritten-* >/dev/null 2>&1 && pass "the first attempt's results are kept aside" ||
  fail "no overwritten-* folder for the first attempt"

# 12. From the review. The root cause is the error that ended a worker, not
#     one a rank reports and goes on from (check.policy warn).
LOCKSTEP_FAULT=exit:rank=1:step=12 train warnonly 2 "${digits[@]}" --set run.name=warnonly --set model.name=cnn \
  --set model.batch_norm=true --set ddp.broadcast_buffers=false --set check.buffers=true \
  --set check.policy=warn --set checkpoint.every=0
expect_eq "$?" 7 "rank 1 leaves with LOCKSTEP_FAULT's exit 7 while rank 0 logs check warnings"
expect_grep "$WORK/warnonly.out" "root cause: rank 1 " "the root cause is rank 1, not rank 0's warnings"
# A restart does not turn a refusal into an overwrite of another run's folder.
"$LOCKSTEP_RUN" --nproc-per-node 2 --master-port 0 --max-restarts 1 "$LOCKSTEP" train "${digits[@]}" \
  --set run.name=diverged >"$WORK/notmine.out" 2>&1
expect_eq "$?" 2 "--max-restarts into another run's directory: exit 2, on every attempt"
if ls -d "$runs/diverged"/overwritten-* >/dev/null 2>&1; then fail "the other run's results were moved"; else pass "the other run's results stay"; fi
# Touching a token file (same bytes) is no change; every rank stops alike
# on a real one, before reading it (ranks started by hand: each one's code).
cp "$WORK/v7.bin" "$WORK/touch.bin"
train touched 2 "${gpt[@]}" --set run.name=touched --set data.path="$WORK/touch.bin" --set train.max_steps=200 \
  --set checkpoint.every=0 &
job=$!
wait_for 120 "step 25 before the file is touched" grep -q "step 25" "$WORK/touched.out"
touch "$WORK/touch.bin"
wait "$job"
expect_eq "$?" 0 "touching the token file under a running job is no change"
$PY -c "
import random, struct
random.seed(3)
big = [random.randrange(1000) for _ in range(400000)]
open('$WORK/big2.bin', 'wb').write(struct.pack('<%dH' % len(big), *big))"
ranks shrunk2 "${gpt[@]}" --set run.name=shrunk2 --set data.path="$WORK/big2.bin" \
  --set train.max_steps=1000000 --set train.epochs=1000 --set checkpoint.every=0 &
job=$!
wait_for 120 "step 25 of the job whose file is cut" grep -q "step 25" "$WORK/shrunk2.0"
truncate -s 1000 "$WORK/big2.bin"
wait "$job"
expect_eq "$(cat "$WORK/shrunk2.codes")" "2 2" "a token file cut under a job: exit 2 on both ranks, without the launcher"
for r in 0 1; do
  expect_grep "$WORK/shrunk2.$r" "token file '$WORK/big2.bin' changed under the running job" "rank $r names the file"
done
# A NaN in a BatchNorm's running_var (a buffer) is refused too.
train bn 2 "${digits[@]}" --set run.name=bn --set model.name=cnn --set model.batch_norm=true
expect_eq "$?" 0 "a cnn with BatchNorm"
rm -rf "$WORK/bnck" && cp -r "$runs/bn/checkpoints/step_00000020" "$WORK/bnck"
f="$WORK/bnck/model.pt" $PY -c "
import os, torch, hashlib
f = os.environ['f']; s = torch.load(f)
k = [k for k in s if k.endswith('running_var')][0]; s[k][0] = float('nan'); torch.save(s, f)
ck = os.path.dirname(f); lines = open(ck + '/MANIFEST').read().splitlines()
h = hashlib.sha256(open(f, 'rb').read()).hexdigest()
open(ck + '/MANIFEST', 'w').write(''.join((h + '  model.pt' if l.endswith('  model.pt') else l) + '\n' for l in lines))"
train bnnan 2 "${digits[@]}" --set run.name=bnnan --set model.name=cnn --set model.batch_norm=true \
  --set checkpoint.resume="$WORK/bnck"
expect_eq "$?" 2 "a NaN running_var in model.pt: exit 2"
expect_grep "$WORK/bnnan.out" "model.pt: buffer '[^']*running_var' holds NaN" "naming the buffer"
# Weights made non-finite by the optimizer step itself are never saved.
train eps0 2 "${digits[@]}" --set run.name=eps0 --set optim.name=adam --set optim.eps=0 \
  --set optim.lr=0.001 --set checkpoint.every=1
expect_eq "$?" 1 "Adam with eps 0 (NaN weights after a finite step): exit 1"
expect_grep "$WORK/eps0.out" "training diverged at step 1: parameter '[^']*' holds NaN or inf after the optimizer step" "naming the parameter"
if [ -e "$runs/eps0/checkpoints/step_00000001" ]; then fail "step 1's NaN weights were saved"; else pass "no checkpoint of the NaN weights"; fi
# generate refuses a NaN weight before printing anything.
gen_tamper gnan model.pt "s = torch.load(f); s['transformer.h.0.mlp.c_fc.weight'][0, 0] = float('nan'); torch.save(s, f)"
"$LOCKSTEP" generate --checkpoint "$WORK/gnan" --prompt "In the" >"$WORK/gnan.out" 2>"$WORK/gnan.err"
expect_eq "$?" 2 "generate with a NaN weight: exit 2 (was: exit 4 after the prompt)"
expect_grep "$WORK/gnan.err" "model.pt: entry 'transformer.h.0.mlp.c_fc.weight' is not finite" "naming it"
expect_eq "$(stat -c %s "$WORK/gnan.out")" 0 "and nothing on stdout"
# Resuming by name from an older checkpoint sets the later ones aside, so
# that rotation keeps the new line's and auto returns to it.
train line 2 "${digits[@]}" --set run.name=line --set checkpoint.every=5 --set checkpoint.keep=3
train rollback 2 "${digits[@]}" --set run.name=line --set checkpoint.every=1 --set checkpoint.keep=3 \
  --set checkpoint.resume="$runs/line/checkpoints/step_00000010" --set train.max_steps=14
expect_eq "$?" 0 "resuming from step 10 of 20"
expect_grep "$WORK/rollback.out" "resumed from step 10: the 2 later checkpoint\(s\) of this run \(step_00000015 to step_00000020" "the later checkpoints are set aside"
expect_eq "$(ls "$runs/line/checkpoints" | tr '\n' ' ')" "step_00000012 step_00000013 step_00000014 " "rotation kept the resumed run's own"
ls "$runs/line"/superseded-*/step_00000020/MANIFEST >/dev/null 2>&1 && pass "step_00000020 is kept in superseded-*/" || fail "step_00000020 is gone"
# A run that failed with only TensorBoard's file reruns; overwrite moves
# only lockstep's outputs (a data file the user keeps there stays).
train tb 2 "${digits[@]}" --set run.name=tb --set log.tensorboard=true --set optim.lr=1000000
train tb2 2 "${digits[@]}" --set run.name=tb --set log.tensorboard=true --set optim.lr=1000000
expect_eq "$?" 1 "a diverged run with TensorBoard reruns (and diverges again: exit 1, not 2)"
cp "$WORK/rows.csv" "$runs/base/mydata.csv"
train over2 2 "${digits[@]}" --set run.name=base --set run.overwrite=true
expect_eq "$?" 0 "run.overwrite again"
[ -f "$runs/base/mydata.csv" ] && pass "the user's own file stays in the run directory" || fail "run.overwrite moved the user's file"
# best/ lost between two renames is put back before a resume looks for it.
mv "$ckd/best" "$ckd/.old-best-99999996"
train frombest 2 "${digits[@]}" --set run.name=best --set checkpoint.resume="$ckd/best" --set train.max_steps=30
expect_eq "$?" 0 "resuming from best/ right after an interrupted replacement"
# A nanoGPT file whose tokens hold a long run of zeros is no header.
$PY -c "
import struct
t = [17, 4, 2, 9] + [0] * 600 + [5] * 5000
open('$WORK/zeros.bin', 'wb').write(struct.pack('<%dH' % len(t), *t))"
train zeros 2 "${gpt[@]}" --set run.name=zeros --set data.path="$WORK/zeros.bin" --set train.max_steps=2
expect_eq "$?" 0 "a nanoGPT file with 600 zero tokens near its start trains"
finish
