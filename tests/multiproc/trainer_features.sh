#!/usr/bin/env bash
# Evaluation during training, the best checkpoint, early stopping and
# TensorBoard event files (docs/training.md), on 2 ranks:
# - train.eval_every: records every 50 steps; the 2-rank evaluation equals
#   one process's over the whole validation split for the same weights;
#   train.eval_batches bounds it;
# - checkpoint.keep_best: checkpoints/best holds the best evaluation's
#   weights, its metric and step in best.yaml (in its MANIFEST);
# - log.tensorboard: the event file decoded by an independent reader
#   (tests/python/tfevents.py: framing, both CRC-32C, the protobuf fields)
#   holds the config and the same scalars as metrics.jsonl;
# - train.early_stop: every rank stops at the same step, with a final
#   checkpoint and the reason; a run interrupted and resumed stops at the
#   same step (the watch is in state.yaml); bad keys exit 2;
# - the live progress line (Note [Progress line]): under a pseudo-terminal
#   lockstep-run draws one line from rank 0's records with an ETA, log
#   lines above it, nothing garbled; none without a terminal;
# - lockstep eval: a checkpoint's validation figures as JSON on 1, 2 and 3
#   ranks, equal to the trainer's own evaluation of the same weights; bad
#   input exits 2.
source "$(dirname "$0")/lib.sh"
root=$(cd "$(dirname "$0")/../.." && pwd)
runs=$RUNS
export OMP_NUM_THREADS=1

# 1. The issue's run: eval every 50 steps, the best kept, TensorBoard.
train run 2 --set run.name=features --set train.eval_every=50 --set checkpoint.keep_best=val_loss \
  --set log.tensorboard=true
expect_eq "$?" 0 "eval_every=50, keep_best=val_loss, tensorboard=true on 2 ranks"
run="$runs/features"
expect_eq "$(grep -c '"at": "eval_every"' "$run/metrics.jsonl")" 9 "evaluations at steps 50, 100, ..., 450 (9)"
expect_grep "$run/metrics.jsonl" '^\{"step": 250, "epoch": 11, "val_loss": [0-9.]+, "val_accuracy": [0-9.]+, "at": "eval_every"\}$' "step 250's record"
expect_grep "$run/metrics.jsonl" '"samples_per_s": [0-9.]+, "samples_per_s_per_rank": [0-9.]+, ' "samples/s in all and per rank"
best="$run/checkpoints/best"
(cd "$best" && sha256sum -c --quiet MANIFEST) && pass "best/ verifies with its MANIFEST" || fail "best/ does not verify"
expect_grep "$best/MANIFEST" "  best.yaml\$" "best.yaml is in the MANIFEST"
$PY - "$run/metrics.jsonl" "$best/best.yaml" <<'PY' >"$WORK/best.check" 2>&1
import json, sys
vals = [json.loads(l) for l in open(sys.argv[1]) if '"val_loss"' in l]
vals = [v for v in vals if not v.get("partial")]
lowest = min(vals, key=lambda v: v["val_loss"])
best = dict(line.split(": ", 1) for line in open(sys.argv[2]).read().splitlines())
assert best["metric"] == "val_loss" and best["mode"] == "min", best
assert int(best["step"]) == lowest["step"], (best, lowest)
assert abs(float(best["value"]) - lowest["val_loss"]) <= 1e-7 * lowest["val_loss"], (best, lowest)
print(f"best step {best['step']} value {best['value']}")
PY
expect_eq "$?" 0 "best.yaml names the lowest val_loss of metrics.jsonl and its step ($(cat "$WORK/best.check"))"
step=$(sed -n 's/^step: //p' "$best/best.yaml")
expect_grep "$best/state.yaml" "^step: $step\$" "best/ holds that step's state"
$PY -c "import torch; sd = torch.load('$best/model.pt'); assert 'layers.0.weight' in sd" &&
  pass "torch.load opens best/model.pt" || fail "torch.load cannot open best/model.pt"

events=$(ls "$run"/events.out.tfevents.* 2>/dev/null | head -1)
[ -n "$events" ] && pass "an event file: $(basename "$events")" || fail "no events.out.tfevents.* in $run"
$PY "$root/tests/python/tfevents.py" "$events" >"$WORK/events.jsonl" 2>"$WORK/events.err"
expect_eq "$?" 0 "the independent reader decodes it (framing, both CRC-32C, protobuf)" || cat "$WORK/events.err"
$PY - "$WORK/events.jsonl" "$run/metrics.jsonl" <<'PY' >"$WORK/events.check" 2>&1
import json, sys
events = [json.loads(l) for l in open(sys.argv[1])]
assert events[0] == {"file_version": "brain.Event:2"}, events[0]
config = [e for e in events if e.get("tag") == "config"]
assert config and config[0]["plugin"] == "text" and 'keep_best: "val_loss"' in config[0]["text"], config
scalars = {(e["tag"], e["step"]): e["value"] for e in events if "value" in e}
metrics = [json.loads(l) for l in open(sys.argv[2])]
checked = 0
def same(a, b):
    return abs(a - b) <= 1e-6 * max(1.0, abs(b))
for m in metrics:
    if "loss" in m:
        for tag, key in (("train/loss", "loss"), ("train/lr", "lr"), ("train/accuracy", "accuracy"),
                         ("train/comm_bytes_per_step", "comm_bytes_per_step")):
            assert same(scalars[(tag, m["step"])], m[key]), (tag, m)
            checked += 1
        assert ("train/samples_per_s", m["step"]) in scalars and ("train/comm_share", m["step"]) in scalars
    if "val_loss" in m:
        assert same(scalars[("val/loss", m["step"])], m["val_loss"]), m
        assert same(scalars[("val/accuracy", m["step"])], m["val_accuracy"]), m
        checked += 2
print(f"{checked} scalars equal metrics.jsonl's; {len(events)} values in all")
PY
expect_eq "$?" 0 "tags, steps and values equal metrics.jsonl's: $(tail -1 "$WORK/events.check")"

# 2. The 2-rank evaluation is one process's over the whole split: the
#    weights of step 400 evaluated by 1 rank (lr 0 for one step: the
#    weights do not move) give step 400's val_loss and val_accuracy.
train run 1 --set run.name=single --set model.init_from="$run/checkpoints/step_00000400/model.pt" \
  --set optim.lr=0 --set optim.momentum=0 --set train.max_steps=1 --set checkpoint.every=0
expect_eq "$?" 0 "one rank evaluates step 400's weights"
$PY - "$run/metrics.jsonl" "$runs/single/metrics.jsonl" <<'PY' >"$WORK/single.check" 2>&1
import json, sys
two = next(json.loads(l) for l in open(sys.argv[1]) if '"val_loss"' in l and json.loads(l)["step"] == 400)
one = next(json.loads(l) for l in open(sys.argv[2]) if '"val_loss"' in l)
assert abs(two["val_loss"] - one["val_loss"]) <= 1e-6 * one["val_loss"], (two, one)
assert two["val_accuracy"] == one["val_accuracy"], (two, one)
print(f"val_loss {two['val_loss']} (2 ranks) vs {one['val_loss']} (1 rank), accuracy {one['val_accuracy']}")
PY
expect_eq "$?" 0 "2 ranks' evaluation equals 1 process's: $(tail -1 "$WORK/single.check")"

# 3. train.eval_batches: 1 batch of 256 rows per rank of the synthetic
#    data's 819 validation examples: 512 evaluated.
train run 2 --set run.name=bounded --set data.name=synthetic --set train.max_steps=20 \
  --set train.eval_every=10 --set train.eval_batches=1 --set checkpoint.every=0
expect_grep "$WORK/run.out" "\[rank0\]: .*validation: loss [0-9.]+ accuracy [0-9.]+ \(512 examples, step 10\)" "eval_batches=1 evaluates 2 x 256 examples"

# 4. Early stopping: val_loss must improve by 100 (it cannot): evaluations
#    at 10 (the first, the best), 20, 23 (the epoch's end), 30: stop at 30.
stop=(--set train.eval_every=10 --set train.early_stop.metric=val_loss
      --set train.early_stop.patience=3 --set train.early_stop.min_delta=100 --set checkpoint.every=0)
train run 2 --set run.name=early "${stop[@]}"
expect_eq "$?" 0 "an early-stopped run exits 0"
expect_grep "$WORK/run.out" "\[rank0\]: .*done: 30 steps" "rank 0 stops at step 30"
expect_grep "$WORK/run.out" "\[rank1\]: .*done: 30 steps" "rank 1 stops at step 30"
expect_grep "$WORK/run.out" "early stop at step 30: val_loss has not improved by more than 100 for 3 evaluations \(best [0-9.]+ at step 10\)" "and says why"
expect_grep "$runs/early/metrics.jsonl" '"early_stop": "early stop at step 30' "metrics.jsonl records it"
[ -d "$runs/early/checkpoints/step_00000030" ] && pass "a final checkpoint at step 30" || fail "no checkpoint at step 30"

# 5. ... and survives a resume: stopped at 25 (after 10, 20, 23), resumed,
#    it stops at 30 again (a fresh watch would stop at 50).
train run 2 --set run.name=early2 "${stop[@]}" --set train.max_steps=25
expect_grep "$runs/early2/checkpoints/step_00000025/state.yaml" "^early_stop:" "state.yaml holds the early-stop watch"
train run 2 --set run.name=early2 "${stop[@]}" --set checkpoint.resume=auto
expect_grep "$WORK/run.out" "\[rank0\]: .*done: 30 steps" "the resumed run stops at step 30 too"

# ... also from a checkpoint taken at an epoch's last step (23) by
#    checkpoint.every: the epoch's evaluation comes before that checkpoint,
#    so resuming from it stops at 30 as well (it once held the watch from
#    before the evaluation, and stopped at 40).
train run 2 --set run.name=early3 "${stop[@]}" --set train.max_steps=24 --set checkpoint.every=23
expect_grep "$runs/early3/checkpoints/step_00000023/state.yaml" "^  bad: 2\$" "step 23's checkpoint counts its own evaluation"
train run 2 --set run.name=early3b "${stop[@]}" --set checkpoint.resume="$runs/early3/checkpoints/step_00000023"
expect_grep "$WORK/run.out" "\[rank0\]: .*done: 30 steps" "resumed from step 23, it stops at step 30"

# 6. A nested YAML mapping, and bad input.
cat >"$WORK/nested.yaml" <<'YAML'
train:
  epochs: 3
  eval_every: 10
  early_stop:
    metric: val_accuracy
    patience: 2
data:
  name: digits
YAML
"$LOCKSTEP" train --config "$WORK/nested.yaml" --set run.dir="$runs" --set run.name=nested \
  --set log.progress=plain >"$WORK/run.out" 2>&1
expect_eq "$?" 0 "train: {early_stop: {metric, patience}} in YAML"
expect_grep "$runs/nested/config.yaml" '^  early_stop.metric: "val_accuracy"$' "is read as train.early_stop.metric"
train run 1 --set run.name=bad --set checkpoint.keep_best=val_loss --set data.validation_fraction=0
expect_eq "$?" 2 "keep_best without a validation split exits 2"
expect_grep "$WORK/run.out" "checkpoint.keep_best watches a validation metric, but the validation split is empty" "saying why"
# A MANIFEST that lists a file twice, or is a FIFO, is refused unread.
cp -r "$runs/early/checkpoints/step_00000030" "$WORK/twice"
line=$(grep ' model.pt$' "$WORK/twice/MANIFEST") && echo "$line" >>"$WORK/twice/MANIFEST"
train run 2 --set run.name=twice --set checkpoint.resume="$WORK/twice"
expect_eq "$?" 2 "a MANIFEST listing a file twice exits 2"
expect_grep "$WORK/run.out" "MANIFEST lists 'model.pt' twice" "naming the file"
cp -r "$runs/early/checkpoints/step_00000030" "$WORK/fifo"
rm "$WORK/fifo/MANIFEST" && mkfifo "$WORK/fifo/MANIFEST"
timeout 60 "$LOCKSTEP" train --config "$root/configs/digits.yaml" --set run.dir="$runs" --set run.name=fifo \
  --set checkpoint.resume="$WORK/fifo" >"$WORK/run.out" 2>&1
expect_eq "$?" 2 "a MANIFEST that is a FIFO exits 2 (no hang)"
train run 1 --set run.name=bad --set train.early_stop.metric=loss
expect_eq "$?" 2 "an unknown metric exits 2"
expect_grep "$WORK/run.out" "none, val_loss, val_accuracy, val_perplexity" "listing the valid ones"
# The live progress line. `script` gives lockstep-run a pseudo-terminal;
# tests/python/terminal.py replays what the terminal shows.
gpt=(--config "$root/configs/gpt-text.yaml" --set model.n_layer=2 --set model.n_embd=64
     --set train.max_steps=40 --set log.every=20 --set checkpoint.every=0 --set check.every=0)
script -qfec "stty cols 132 rows 50; OMP_NUM_THREADS=1 '$LOCKSTEP_RUN' --nproc-per-node 2 --master-port 0 '$LOCKSTEP' train ${gpt[*]} --set run.dir='$runs' --set run.name=pty" \
  /dev/null >"$WORK/typescript" 2>&1
expect_eq "$?" 0 "a GPT run under a pseudo-terminal"
grep -q $'\r\033\[K\[#*\.*\] step ' "$WORK/typescript" && pass "lockstep-run redraws one live line in place" ||
  fail "no live line in: $(head -c 600 "$WORK/typescript" | cat -v)"
$PY "$root/tests/python/terminal.py" "$WORK/typescript" >"$WORK/screen"
$PY "$root/tests/python/terminal.py" "$WORK/typescript" --until "\[#+\.+\] step (2[4-9]|3[0-9])/40 [^\r]*epoch 1" >"$WORK/screen30"
expect_grep "$WORK/screen30" "^\[#+\.+\] step (2[4-9]|3[0-9])/40 [0-9]+% \| ETA [0-9]+:[0-9]{2} \| [0-9]+:[0-9]{2} elapsed \| loss [0-9.]+ \| [0-9.]+k? tokens/s \| epoch 1" "mid-run it shows step/total, an ETA, elapsed, loss and tokens/s"
expect_grep "$WORK/screen" "^\[#{20}\] step 40/40 100% \| done \| " "the last state stays on the screen"
bad=$(grep -v -E "^(\[rank[01]\]: |lockstep-run: |\[#+\.*\] step )" "$WORK/screen" | head -3)
expect_eq "$bad" "" "every line on the screen is whole: a log line above, the live line below"
expect_grep "$WORK/screen" "^\[rank1\]: .*done: 40 steps" "the other rank's lines are there too"
expect_grep "$WORK/screen" "^\[rank0\]: .*step 20/40 epoch 1 loss" "and the plain step lines every log.every"
# Without a terminal, as before: plain lines, no escape sequences.
"$LOCKSTEP_RUN" --nproc-per-node 2 --master-port 0 "$LOCKSTEP" train "${gpt[@]}" --set run.dir="$runs" \
  --set run.name=piped >"$WORK/run.out" 2>&1
expect_eq "$?" 0 "the same run into a pipe"
grep -q $'\033' "$WORK/run.out" && fail "escape sequences in piped output" || pass "no escape sequences without a terminal"
expect_grep "$WORK/run.out" "step 40/40 epoch 1 loss" "the plain step lines"
# A stray LOCKSTEP_PROGRESS_FD (not lockstep-run's pipe) is ignored, said once.
LOCKSTEP_PROGRESS_FD=1 "$LOCKSTEP" train "${gpt[@]}" --set run.dir="$runs" --set run.name=stray \
  --set train.max_steps=2 >"$WORK/run.out" 2>"$WORK/err"
expect_eq "$?" 0 "a stray LOCKSTEP_PROGRESS_FD does not stop a run"
expect_grep "$WORK/err" "LOCKSTEP_PROGRESS_FD=1: not a pipe of lockstep-run's" "and is named"
grep -q "^progress step=" "$WORK/run.out" && fail "records written to stdout" || pass "no record reaches stdout"

# lockstep eval (docs/training.md, "Evaluating a checkpoint"): the JSON
# equals the trainer's final evaluation of the same weights (metrics.jsonl,
# written by 2 ranks), on any number of ranks.
train run 2 --set run.name=evals --set train.max_steps=40 --set checkpoint.every=20
val=$(grep '"val_loss"' "$runs/evals/metrics.jsonl" | tail -1)
"$LOCKSTEP" eval --checkpoint "$runs/evals" >"$WORK/eval1.json" 2>"$WORK/eval1.err"
expect_eq "$?" 0 "lockstep eval on one process"
for n in 2 3; do
  "$LOCKSTEP_RUN" --nproc-per-node $n --master-port 0 "$LOCKSTEP" eval --checkpoint "$runs/evals" \
    --output "$WORK/eval$n.json" >"$WORK/run.out" 2>&1
  expect_eq "$?" 0 "lockstep eval on $n ranks"
done
$PY - "$WORK" "$val" <<'PY' >"$WORK/eval.check" 2>&1
import json, sys
work, val = sys.argv[1], json.loads(sys.argv[2])
for n in (1, 2, 3):
    e = json.load(open(f"{work}/eval{n}.json"))
    assert e["ranks"] == n and e["step"] == 40 and e["split"] == "validation", e
    assert e["checkpoint"].endswith("/step_00000040"), e
    assert e["examples"] == 359, e
    assert abs(e["loss"] - val["val_loss"]) < 2e-6, (n, e["loss"], val["val_loss"])
    assert abs(e["accuracy"] - val["val_accuracy"]) < 2e-6, (n, e["accuracy"], val["val_accuracy"])
    assert "perplexity" not in e and e["precision"] == "fp32", e
print("same figures", val["val_loss"], val["val_accuracy"])
PY
expect_eq "$?" 0 "eval's loss and accuracy on 1, 2 and 3 ranks equal the trainer's ($(tail -1 "$WORK/eval.check"))"
"$LOCKSTEP" eval --checkpoint "$runs/evals/checkpoints/step_00000020" >"$WORK/eval20.json" 2>/dev/null
$PY -c "
import json, sys
a, b = json.load(open('$WORK/eval20.json')), json.load(open('$WORK/eval1.json'))
assert a['step'] == 20 and a['loss'] > b['loss'] + 0.01, (a, b)
" && pass "an older checkpoint gives its own step and a higher loss" || fail "step 20's figures: $(cat "$WORK/eval20.json")"
"$LOCKSTEP" eval --checkpoint "$WORK/nowhere" >"$WORK/run.out" 2>&1
expect_eq "$?" 2 "eval of a missing checkpoint exits 2"
expect_grep "$WORK/run.out" "nowhere': neither a checkpoint folder .*does not exist" "naming it"
"$LOCKSTEP" eval --checkpoint "$runs/evals" --set model.hidden=64 >"$WORK/run.out" 2>&1
expect_eq "$?" 2 "eval with a model that is not the checkpoint's exits 2"
expect_grep "$WORK/run.out" "model.pt" "naming model.pt"
"$LOCKSTEP" eval --checkpoint "$runs/evals" --set data.validation_fraction=0 >"$WORK/run.out" 2>&1
expect_eq "$?" 2 "eval without a validation split exits 2"
expect_grep "$WORK/run.out" "the validation split is empty" "saying so"
cp -r "$runs/evals/checkpoints/step_00000040" "$WORK/tampered"
printf 'x' | dd of="$WORK/tampered/model.pt" bs=1 seek=100 conv=notrunc 2>/dev/null
"$LOCKSTEP" eval --checkpoint "$WORK/tampered" >"$WORK/run.out" 2>&1
expect_eq "$?" 2 "eval of a checkpoint whose model.pt changed exits 2"
expect_grep "$WORK/run.out" "model.pt" "naming the file"
finish
