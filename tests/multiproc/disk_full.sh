#!/usr/bin/env bash
# A full disk during training, on a small tmpfs: the checkpoint that does not
# fit ends the run with exit 2 naming the file and ENOSPC, and saying what
# checkpoint is kept;
# no temporary folder is left; the previous checkpoint still verifies and
# resumes; metrics.jsonl holds only complete records. Needs root to mount
# the tmpfs; exits 77 (skipped) where it cannot be mounted.
source "$(dirname "$0")/lib.sh"
root=$(cd "$(dirname "$0")/../.." && pwd)
disk="$WORK/disk"
mkdir -p "$disk"
if [ "$(id -u)" -ne 0 ] || ! mount -t tmpfs -o size=4m tmpfs "$disk" 2>"$WORK/mount.err"; then
  echo "skipped: cannot mount a tmpfs here ($(cat "$WORK/mount.err" 2>/dev/null))"
  exit 77
fi
trap 'umount "$disk" 2>/dev/null; rm -rf "$WORK"' EXIT
TRAIN_ARGS=(--set run.dir="$disk" --set run.name=full --set checkpoint.every=10 --set checkpoint.keep=1
            --set log.every=5)
train run 2 --set train.max_steps=10
expect_eq "$?" 0 "a 10-step run with a checkpoint fits on the 4 MB disk"
ckpt="$disk/full/checkpoints/step_00000010"
[ -f "$ckpt/MANIFEST" ] && pass "the first checkpoint is there" || fail "no first checkpoint"
# Leave ~40 KB: enough to start and write metrics for a while, not for a checkpoint.
avail=$(df --output=avail -B1 "$disk" | tail -1)
head -c $((avail - 40960)) /dev/zero >"$disk/filler" 2>/dev/null
train run 2 --set train.max_steps=20 --set checkpoint.resume=auto
rc=$?
expect_eq "$rc" 2 "the run whose next checkpoint does not fit exits 2 (not an abort)"
expect_grep "$WORK/run.out" "cannot write: checkpoint of step 20 not written \(the previous one, .*/step_00000010, is intact\): cannot write '.*/\.tmp-step_00000020-[0-9]+/.*': ENOSPC: no space left on device" \
  "the error names the step, the checkpoint kept, the file and ENOSPC"
if grep -q "bad data:" "$WORK/run.out"; then fail "a full disk is reported as 'bad data:'"; else pass "not as 'bad data:'"; fi
expect_eq "$(ls -a "$disk/full/checkpoints" | grep -c '^\.tmp-')" 0 "no temporary folder is left"
(cd "$ckpt" && sha256sum -c --quiet MANIFEST) && pass "the previous checkpoint still verifies" ||
  fail "the previous checkpoint is damaged"
bad=$($PY -c "
import json, sys
bad = 0
for line in open('$disk/full/metrics.jsonl'):
    try: json.loads(line)
    except Exception: bad += 1
print(bad)")
expect_eq "$bad" 0 "metrics.jsonl holds only complete JSON records"
# checkpoint.on_error: warn trains on past the failed checkpoint, says so on
# every rank, and still leaves no temporary folder.
# A run none of whose checkpoints could be written does not end 0.
train run 2 --set train.max_steps=20 --set checkpoint.resume=auto --set checkpoint.on_error=warn
expect_eq "$?" 2 "with on_error: warn the run trains to the end, then exits 2: none of its checkpoints exists"
expect_grep "$WORK/run.out" "\[rank0\]: .*checkpoint of step 20 not written \(the previous one, .*step_00000010, is intact\).*ENOSPC.*; training goes on \(checkpoint.on_error: warn\)" \
  "rank 0 warns with the cause and what is kept"
expect_grep "$WORK/run.out" "\[rank1\]: .*checkpoint of step 20 not written .*ENOSPC.*; training goes on" "rank 1 warns too, with rank 0's cause"
expect_grep "$WORK/run.out" "training ended, but none of this run's 1 checkpoint\(s\) could be written \(checkpoint.on_error: warn\), so its weights exist nowhere on disk" "and says so at the end"
expect_eq "$(ls -a "$disk/full/checkpoints" | grep -c '^\.tmp-')" 0 "no temporary folder is left"
# A fresh run on the full disk: the warning says no checkpoint exists.
"$LOCKSTEP_RUN" --nproc-per-node 2 --master-port 0 "$LOCKSTEP" train --config "$root/configs/digits.yaml" \
  --set run.dir="$disk" --set run.name=fresh --set checkpoint.every=10 --set train.max_steps=10 \
  --set checkpoint.on_error=warn >"$WORK/fresh.out" 2>&1
expect_eq "$?" 2 "a fresh run that could write no checkpoint exits 2"
expect_grep "$WORK/fresh.out" "checkpoint of step 10 not written \(no earlier checkpoint exists\)" "its warning does not claim a previous checkpoint"
# Space again: the run resumes from the intact checkpoint.
rm -f "$disk/filler"
train run 2 --set train.max_steps=20 --set checkpoint.resume=auto
expect_eq "$?" 0 "with space again, the run resumes and finishes"
expect_grep "$WORK/run.out" "resumed from .*step_00000010 at step 10" "from the intact checkpoint"
finish
