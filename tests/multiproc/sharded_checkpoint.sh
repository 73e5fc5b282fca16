#!/usr/bin/env bash
# checkpoint.format: sharded and checkpoint.async (docs/checkpoints.md,
# Note [Sharded checkpoints]):
# 1. same world size: a sharded resume ends bit-identical to the
#    uninterrupted run, also across stages (zero 0 -> zero 3, zero 1 -> 2);
#    each rank wrote its own shard, in about equal parts;
# 2. elastic: 2 ranks (zero 1) -> 3 (zero 3) -> 1 (zero 0) within 1e-6 of
#    the uninterrupted run (global batch 96 throughout);
# 3. consolidate: model.pt and optimizer.pt byte-identical to the
#    consolidated run's, equal in Python (torch.equal), the GPT's model.pt
#    loads into tests/python/gpt.py with strict=True; lockstep resumes from
#    the consolidated folder; info lists tensors, shards, world size, stage;
#    generate and eval read a sharded checkpoint;
# 4. async: the GPT at zero 3, a checkpoint every 3 steps written in the
#    background: the same final weights, every checkpoint complete, a
#    resume from one bit-identical;
# 5. kill -9 (a rank or the launcher, 12 times) during async saves: the
#    checkpoint resume would pick always verifies whole, every run after the
#    first resumes from the newest and trains on (each kill waits for that,
#    so the count does not depend on the machine's load; "the newest" may
#    be one the last kill's surviving rank 0 committed while shutting down:
#    its background writer finishes a save whose shards were all written),
#    and some kills landed mid-save (their staging folders removed at
#    restart);
# 6. hostile folders exit 2 naming the file: a range outside its file,
#    overlapping ranges, a wrong shape, a shape without its bytes, a missing
#    shard, a modified shard, a MANIFEST that omits a shard;
#    checkpoint.async without the sharded format is refused.
#   sharded_checkpoint.sh LOCKSTEP LOCKSTEP_RUN
source "$(dirname "$0")/lib.sh"
root=$(cd "$(dirname "$0")/../.." && pwd)
runs=$RUNS
export OMP_NUM_THREADS=1
text="$root/data/kjv.txt"
[ -f "$text" ] || { fail "$text is missing (scripts/make_text.sh makes it; scripts/setup.sh runs that)"; finish; }
head -c 200000 "$text" >"$WORK/kjv-head.txt"
APPEND=1  # a resumed run's log continues in NAME.out
ck() { printf '%s/%s/checkpoints/step_%08d' "$runs" "$1" "$2"; }

# 1. Same world size: bit-identical, across stages too.
d=(--set optim.name=adamw --set optim.lr=0.003 --set data.batch_size=48 --set train.epochs=6)
train whole 2 --config "$ROOT/configs/digits.yaml" "${d[@]}" --set train.max_steps=24
for pair in "0 3" "1 2" "3 0"; do
  set -- $pair
  name="same-$1-$2"
  train "$name" 2 --config "$ROOT/configs/digits.yaml" "${d[@]}" --set optim.zero="$1" --set train.max_steps=11 \
    --set checkpoint.format=sharded
  train "$name" 2 --config "$ROOT/configs/digits.yaml" "${d[@]}" --set optim.zero="$2" --set train.max_steps=24 \
    --set checkpoint.format=sharded --set checkpoint.resume=auto
  same "$name" whole "sharded, 2 ranks: optim.zero $1 for 11 steps, resumed with optim.zero $2 to 24 = the uninterrupted run"
done
split=$($PY - "$(ck same-0-3 11)/metadata.txt" <<'PY'
import sys
lines = [l.split() for l in open(sys.argv[1])]
files = [l for l in lines if l[0] == "file"]
assert [f[1] for f in files] == ["shard_00000.bin", "shard_00001.bin"], files
sizes = [int(f[2]) for f in files]
# Whole tensors by the sorted-greedy rule: the 128x128 layer alone is 2/3 of
# the weights, so the split is 16,384 + its state vs the rest.
assert min(sizes) > 0.3 * sum(sizes), sizes
print(sizes)
PY
)
expect_eq "$?" 0 "each of 2 ranks wrote its own shard, no rank under 30% of the bytes ($split)"

# 2. Elastic, across stages: 2 (zero 1) -> 3 (zero 3) -> 1 (zero 0), global batch 96.
common=(--set optim.schedule=constant --set optim.warmup_steps=0 --set train.epochs=6
  --set checkpoint.format=sharded)
train ewhole 2 --config "$ROOT/configs/digits.yaml" "${common[@]}" --set data.batch_size=48 --set train.max_steps=29
train el 2 --config "$ROOT/configs/digits.yaml" "${common[@]}" --set optim.zero=1 --set data.batch_size=48 --set train.max_steps=20 \
  --set checkpoint.every=20
train el 3 --config "$ROOT/configs/digits.yaml" "${common[@]}" --set optim.zero=3 --set data.batch_size=32 --set train.max_steps=25 \
  --set checkpoint.every=25 --set checkpoint.resume=auto
expect_grep "$WORK/el.out" "optim.zero 1 -> 3" "a sharded zero-1 checkpoint of 2 ranks resumes with optim.zero 3 on 3 ranks"
train el 1 --config "$ROOT/configs/digits.yaml" "${common[@]}" --set data.batch_size=96 --set train.max_steps=29 --set checkpoint.resume=auto
expect_eq "$?" 0 "its sharded zero-3 checkpoint of 3 ranks resumes with optim.zero 0 on 1 rank"
expect_grep "$(ck el 25)/metadata.txt" "^world_size 3$" "the step-25 checkpoint was written by 3 ranks"
expect_eq "$(ls "$(ck el 25)" | grep -c '^shard_')" 3 "as 3 shard files"
for n in ewhole el; do
  "$LOCKSTEP" checkpoint consolidate "$(ck $n 29)" --out "$WORK/$n-29" >"$WORK/cons-$n.out" 2>&1 ||
    fail "consolidate $n: $(tail -2 "$WORK/cons-$n.out")"
done
diff=$($PY - "$WORK/ewhole-29/model.pt" "$WORK/el-29/model.pt" <<'PY'
import sys, torch
a, b = (torch.load(p) for p in sys.argv[1:])
assert list(a) == list(b)
print(max((a[k] - b[k]).abs().max().item() for k in a))
PY
)
expect_lt "${diff:-1}" 1e-6 "2 (zero 1) -> 3 (zero 3) -> 1 (zero 0), sharded: the weights within 1e-6 of the uninterrupted run ($diff)"

# 3. Consolidate: the consolidated run's files, byte for byte.
train cref 2 --config "$ROOT/configs/digits.yaml" "${d[@]}" --set optim.zero=1 --set train.max_steps=12
train csh 2 --config "$ROOT/configs/digits.yaml" "${d[@]}" --set optim.zero=1 --set train.max_steps=12 --set checkpoint.format=sharded
"$LOCKSTEP" checkpoint consolidate "$runs/csh" --out "$WORK/csh-12" >"$WORK/cons.out" 2>&1
expect_eq "$?" 0 "lockstep checkpoint consolidate (a run folder: its newest checkpoint)"
for f in model.pt optimizer.pt; do
  cmp -s "$(ck cref 12)/$f" "$WORK/csh-12/$f" && pass "consolidated $f is byte-identical to the consolidated run's" ||
    fail "consolidated $f differs from the consolidated run's"
done
$PY - "$(ck cref 12)" "$WORK/csh-12" <<'PY' >"$WORK/equal.out" 2>&1
import sys, torch
for f in ("model.pt", "optimizer.pt"):
    a, b = (torch.load(p + "/" + f) for p in sys.argv[1:])
    assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a), f
print("equal")
PY
expect_eq "$?" 0 "and torch.load gives tensors equal (torch.equal) to the run's own"
train csh2 2 --config "$ROOT/configs/digits.yaml" "${d[@]}" --set optim.zero=1 --set train.max_steps=24 \
  --set checkpoint.resume="$WORK/csh-12"
same csh2 whole "lockstep resumes from the consolidated folder, to the uninterrupted run's weights"
"$LOCKSTEP" checkpoint info "$(ck same-0-3 24)" >"$WORK/info.out" 2>&1
expect_eq "$?" 0 "lockstep checkpoint info"
expect_grep "$WORK/info.out" "^format sharded" "info names the format"
expect_grep "$WORK/info.out" "written by 2 rank\\(s\\), optim.zero 3" "info names the writer's world size and stage"
expect_grep "$WORK/info.out" "^step 24 " "info names the step"
expect_grep "$WORK/info.out" "model.pt/layers.0.weight  float32  \[128, 64\]  shard_0000[01].bin  bytes" \
  "info lists each tensor with dtype, shape, shard and byte range"
expect_grep "$WORK/info.out" "optimizer.pt/layers.0.weight.exp_avg_sq" "info lists the optimizer state"

# 4. Async, the GPT at zero 3 (blocks as units), a checkpoint every 3 steps.
g=(--set data.path="$WORK/kjv-head.txt" --set model.n_layer=2 --set model.n_embd=64
  --set model.block_size=32 --set data.batch_size=4 --set train.max_steps=16 --set optim.zero=3)
train gsync 2 --config "$ROOT/configs/gpt-text.yaml" "${g[@]}"
train gasync 2 --config "$ROOT/configs/gpt-text.yaml" "${g[@]}" --set checkpoint.format=sharded --set checkpoint.async=true \
  --set checkpoint.every=3 --set checkpoint.keep=10
same gasync gsync "async sharded saves every 3 steps leave the training unchanged (GPT, zero 3)"
expect_eq "$(grep -c 'written in the background' "$WORK/gasync.out")" 10 \
  "5 checkpoints written in the background (each said on start and on completion)"
bad=0
for s in 3 6 9 12 15 16; do
  "$LOCKSTEP" checkpoint consolidate "$(ck gasync $s)" --out "$WORK/ga-$s" >>"$WORK/ga.out" 2>&1 || bad=$((bad + 1))
done
expect_eq "$bad" 0 "every async checkpoint (3, 6, 9, 12, 15) and the last verify whole"
$PY - "$WORK/ga-16/model.pt" "$runs/gasync/config.yaml" "$root/tests/python" <<'PY' >"$WORK/strict.out" 2>&1
import sys, types, torch
sys.path.insert(0, sys.argv[3])
import gpt
sd = torch.load(sys.argv[1])
n_layer = len({k.split(".")[2] for k in sd if k.startswith("transformer.h.")})
c = types.SimpleNamespace(vocab_size=sd["transformer.wte.weight"].shape[0],
                          block_size=sd["transformer.wpe.weight"].shape[0], n_layer=n_layer,
                          n_head=4, n_embd=sd["transformer.wte.weight"].shape[1], dropout=0.0, bias=True)
m = gpt.GPT(c)
m.load_state_dict(sd, strict=True)
assert all(torch.isfinite(t).all() for t in sd.values())
print("strict")
PY
expect_eq "$?" 0 "the consolidated GPT (zero 3, async) loads into PyTorch's GPT with strict=True"
train gres 2 --config "$ROOT/configs/gpt-text.yaml" "${g[@]}" --set optim.zero=1 --set checkpoint.format=sharded \
  --set checkpoint.resume="$(ck gasync 9)"
same gres gsync "resumed from an async checkpoint (step 9, zero 3 -> zero 1): the uninterrupted weights"
"$LOCKSTEP" generate --checkpoint "$(ck gasync 16)" --prompt "In the" --max-new-tokens 12 --seed 1 >"$WORK/gen.out" 2>&1
"$LOCKSTEP" generate --checkpoint "$(ck gsync 16)" --prompt "In the" --max-new-tokens 12 --seed 1 >"$WORK/gen0.out" 2>&1
cmp -s "$WORK/gen.out" "$WORK/gen0.out" && [ -s "$WORK/gen.out" ] &&
  pass "generate reads a sharded checkpoint (the consolidated one's text)" || fail "generate: $(tail -2 "$WORK/gen.out")"
"$LOCKSTEP_RUN" --nproc-per-node 2 --master-port 0 "$LOCKSTEP" eval --checkpoint "$(ck gasync 16)" \
  --output "$WORK/eval.json" >"$WORK/eval.out" 2>&1
"$LOCKSTEP_RUN" --nproc-per-node 2 --master-port 0 "$LOCKSTEP" eval --checkpoint "$(ck gsync 16)" \
  --output "$WORK/eval0.json" >"$WORK/eval0.out" 2>&1
$PY - "$WORK/eval.json" "$WORK/eval0.json" <<'PY' >"$WORK/evalcmp.out" 2>&1
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:])
assert a["loss"] == b["loss"] and a["examples"] == b["examples"] > 0, (a, b)
print(a["loss"])
PY
expect_eq "$?" 0 "eval on 2 ranks reads it: the consolidated run's loss ($(tail -1 "$WORK/evalcmp.out"))"

# 5. kill -9 during async saves: what resume picks always loads.
k=(--set data.path="$WORK/kjv-head.txt" --set model.n_layer=2 --set model.n_embd=128
  --set model.block_size=64 --set data.batch_size=8 --set train.max_steps=100000 --set train.epochs=1000
  --set optim.zero=2
  --set checkpoint.format=sharded --set checkpoint.async=true --set checkpoint.every=2
  --set checkpoint.keep=2 --set checkpoint.resume=auto --set log.every=1 --set run.overwrite=true)
kills=0 unloadable=0 resumed=0 started=0
# A run has trained on from its resume once its log shows the resume message
# and then a step (the parts load after the message).
trained_on() { awk '/resumed from/ {r = 1} r && /step [0-9]+\// {t = 1} END {exit !t}' "$1"; }
for i in $(seq 1 12); do
  # What resume=auto must pick: the newest complete checkpoint (staging
  # folders are .tmp-step_*), if the kills so far left one.
  had=$(ls -d "$runs/kill/checkpoints"/step_* 2>/dev/null | sort | tail -1)
  # Under timeout: a kill that missed must not leave the run training
  # forever (no background subshell: it would carry this script's EXIT trap).
  timeout -s KILL 90 "$LOCKSTEP_RUN" --nproc-per-node 2 --master-port 0 "$LOCKSTEP" train \
    --config "$root/configs/gpt-text.yaml" --set run.dir="$runs" --set run.name=kill \
    --set log.progress=plain "${k[@]}" >"$WORK/kill-$i.out" 2>&1 &
  guard=$!
  launcher=
  for _ in $(seq 1 50); do launcher=$(pgrep -P "$guard" | head -1) && [ -n "$launcher" ] && break; sleep 0.05; done
  # Until the run trains on after its resume (the first run: until its first
  # checkpoint is complete), or gives up, then a moment more: saves are in
  # flight. The kill lands after that point whatever the load (on a busy
  # core a step can outlast the sleep), so every run after the first starts
  # with a checkpoint and must show its resume and a step after it.
  for _ in $(seq 1 600); do
    if [ -n "$had" ]; then trained_on "$WORK/kill-$i.out" && break; else
      ls -d "$runs/kill/checkpoints"/step_* >/dev/null 2>&1 && break; fi
    kill -0 "$guard" 2>/dev/null || break
    sleep 0.1
  done
  sleep "0.$((RANDOM % 10))$((RANDOM % 10))"
  if [ $((i % 2)) -eq 0 ]; then
    victim=$launcher what=launcher
  else
    # A worker: a process running the lockstep binary (the launcher and its
    # guardian run lockstep-run's).
    victim=$(for p in $(pgrep -f -- "run.name=kill"); do
      [ "$(readlink "/proc/$p/exe" 2>/dev/null)" = "$(readlink -f "$LOCKSTEP")" ] && echo "$p"
    done | shuf -n 1) what=rank
  fi
  [ -n "$victim" ] && kill -9 "$victim" 2>/dev/null && kills=$((kills + 1))
  wait "$guard" 2>/dev/null
  [ $? -eq 137 ] && ! grep -q "killed by signal 9\|SIGKILL" "$WORK/kill-$i.out" && [ "$what" = rank ] &&
    echo "kill $i: the run outlived its kill (timeout)"
  # The survivors of a kill shut down (a loaded core can take seconds);
  # until they are gone one may still commit a checkpoint whose shards
  # were all written.
  for _ in $(seq 1 300); do [ -z "$(leftovers "run.name=kill")" ] && break; sleep 0.1; done
  newest=$(ls -d "$runs/kill/checkpoints"/step_* 2>/dev/null | sort | tail -1)
  if [ -n "$newest" ]; then
    rm -rf "$WORK/kill-cons"
    "$LOCKSTEP" checkpoint consolidate "$newest" --out "$WORK/kill-cons" >"$WORK/kill-cons-$i.out" 2>&1 ||
      { unloadable=$((unloadable + 1)); echo "kill $i ($what): $newest: $(tail -1 "$WORK/kill-cons-$i.out")"; }
  fi
  echo "kill $i ($what): started from $(basename "${had:-nothing}"), newest after: $(basename "${newest:-none}"), last step logged: $(grep -o "step [0-9]*/" "$WORK/kill-$i.out" | tail -1)"
  if [ -n "$had" ]; then
    started=$((started + 1))
    # The newest at its start, or a newer one a survivor of the last kill
    # committed after that (never an older one).
    from=$(grep -o "resumed from $runs/kill/checkpoints/step_[0-9]*" "$WORK/kill-$i.out" | head -1)
    if [ -n "$from" ] && [ $((10#${from##*step_})) -ge $((10#${had##*step_})) ] &&
      trained_on "$WORK/kill-$i.out"; then
      resumed=$((resumed + 1))
    else
      echo "kill $i ($what): started with $had but did not resume from it (or a newer one) and train on; its resume lines:"
      grep -n "resum\|step [0-9]*/" "$WORK/kill-$i.out" | head -8 | sed 's/^/    /'
    fi
  fi
done
expect_lt "11" "$kills" "12 runs killed with SIGKILL during async saves, a rank or the launcher ($kills)"
expect_eq "$unloadable" 0 "after every kill the checkpoint resume picks verifies whole and loads"
expect_eq "$resumed" "$started" "every run that started with a checkpoint resumed from the newest and trained on ($resumed of $started)"
expect_eq "$started" 11 "  runs that started with a checkpoint left by a killed one ($started of 12)"
expect_eq "$(leftovers "run.name=kill")" "" "no process of the killed runs is left"
torn=$(cat "$WORK"/kill-*.out | grep -c "removed .*/\.tmp-step_.*left by a writer that is gone" || true)
expect_lt 0 "${torn:-0}" "kills landed during saves: $torn staging folders of killed writers removed at the next start"

# 6. Hostile folders: exit 2 naming the file.
src=$(ck csh 12)
hostile() {  # hostile NAME WHAT PYTHON-EDIT (of lines: a list of the metadata's lines, split)
  local dir="$WORK/hostile-$1"
  rm -rf "$dir" && cp -r "$src" "$dir"
  $PY - "$dir" "$3" <<'PY'
import hashlib, os, sys
d, edit = sys.argv[1], sys.argv[2]
lines = [l.split(" ") for l in open(d + "/metadata.txt").read().splitlines()]
tensors = [l for l in lines if l[0] == "tensor"]
files = [l for l in lines if l[0] == "file"]
exec(edit)
open(d + "/metadata.txt", "w").write("".join(" ".join(l) + "\n" for l in lines))
man = [l.split("  ") for l in open(d + "/MANIFEST").read().splitlines()]
for m in man:
    if m[1] == "metadata.txt":
        m[0] = hashlib.sha256(open(d + "/metadata.txt", "rb").read()).hexdigest()
open(d + "/MANIFEST", "w").write("".join("  ".join(m) + "\n" for m in man))
PY
  train "h-$1" 2 --config "$ROOT/configs/digits.yaml" "${d[@]}" --set optim.zero=1 --set train.max_steps=13 --set checkpoint.resume="$dir"
  local rc=$?
  expect_eq "$rc" 2 "$2: resume exits 2"
  expect_grep "$WORK/h-$1.out" "$4" "  and names $4"
}
hostile range "a range past its file" 't = tensors[0]; t[5] = str(int(files[int(t[4])][2]) // 64 * 64)' "lie outside shard_"
hostile overlap "overlapping ranges" \
  'same = [t for t in tensors if t[4] == tensors[0][4]]; same[1][5] = str(int(same[0][5]) + 64)' "overlap in shard_"
hostile shape "a wrong shape (bytes kept)" 't = [t for t in tensors if t[1] == "model.pt/layers.0.weight"][0]; t[3] = "64,128"' "layers.0.weight"
hostile bytes "a shape without its bytes" 't = [t for t in tensors if t[1] == "model.pt/layers.0.weight"][0]; t[3] = "128,65"' "layers.0.weight"
rm -rf "$WORK/hostile-missing" && cp -r "$src" "$WORK/hostile-missing" && rm "$WORK/hostile-missing/shard_00001.bin"
train h-missing 2 --config "$ROOT/configs/digits.yaml" "${d[@]}" --set optim.zero=1 --set train.max_steps=13 --set checkpoint.resume="$WORK/hostile-missing"
expect_eq "$?" 2 "a missing shard: resume exits 2"
expect_grep "$WORK/h-missing.out" "shard_00001.bin is missing" "  and names shard_00001.bin"
rm -rf "$WORK/hostile-flip" && cp -r "$src" "$WORK/hostile-flip" &&
  printf '\x7f' | dd of="$WORK/hostile-flip/shard_00000.bin" bs=1 seek=100 conv=notrunc 2>/dev/null
train h-flip 2 --config "$ROOT/configs/digits.yaml" "${d[@]}" --set optim.zero=1 --set train.max_steps=13 --set checkpoint.resume="$WORK/hostile-flip"
expect_eq "$?" 2 "a modified shard: resume exits 2"
expect_grep "$WORK/h-flip.out" "shard_00000.bin's SHA-256 does not match" "  and names shard_00000.bin"
"$LOCKSTEP" checkpoint consolidate "$WORK/hostile-flip" --out "$WORK/flip-out" >"$WORK/flip-cons.out" 2>&1
expect_eq "$?" 2 "consolidate of the modified shard exits 2"
[ ! -e "$WORK/flip-out" ] && pass "  and writes nothing" || fail "consolidate left $WORK/flip-out"
rm -rf "$WORK/hostile-manifest" && cp -r "$src" "$WORK/hostile-manifest" &&
  sed -i '/shard_00001.bin/d' "$WORK/hostile-manifest/MANIFEST"
"$LOCKSTEP" checkpoint info "$WORK/hostile-manifest" >"$WORK/man.out" 2>&1
expect_eq "$?" 2 "a MANIFEST without one shard: info exits 2"
expect_grep "$WORK/man.out" "shard_00001.bin is not in the MANIFEST" "  and names shard_00001.bin"
train h-async 1 --config "$ROOT/configs/digits.yaml" --set checkpoint.async=true
expect_eq "$?" 2 "checkpoint.async with the consolidated format: exit 2"
expect_grep "$WORK/h-async.out" "needs checkpoint.format: sharded" "  and says why"
finish
