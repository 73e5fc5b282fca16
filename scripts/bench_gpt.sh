#!/usr/bin/env bash
# The GPT demo (configs/gpt-text.yaml) in lockstep beside the same GPT in
# PyTorch's own DDP (tests/python/gpt.py, scripts/bench_gpt_torch.py): same
# model, batches, AdamW and clipping, 2 ranks, one thread each, run in
# alternation ROUNDS times. Prints the median tokens/s of each contender and
# the ratio to PyTorch's. lockstep's backend is auto (shm on one host) and,
# for a like-for-like row, gloo; PyTorch's is gloo. lockstep's rows run
# without the weight check, and once with it on every step (the demo's
# setting), to show what that costs.
#   scripts/bench_gpt.sh      (env: ROUNDS=3 STEPS=40 WARMUP=10 NPROC=2 PRECISION=fp32|bf16
#                              SHAPE="n_layer n_head n_embd block_size batch_size" (default: the
#                              demo's "4 4 128 128 16") ONLY=shm: lockstep's shm row alone beside
#                              PyTorch's; MFU=1: lockstep reports its model FLOP utilisation;
#                              SPLIT=1 (SPLIT_STEPS=N timed steps, default STEPS): then one
#                              profiling pass each, the step split into forward,
#                              backward, clipping and optimizer, each timed to the device's end
#                              (lockstep's log.sync_timing, bench_gpt_torch.py --split);
#                              NONFINITE_ROW=1 (cuda): one more lockstep row, train.stop_on_nonfinite off
#                              (its per-step wait for the device measured))
#   DEVICE=cuda NPROC=1 scripts/bench_gpt.sh   on a GPU: lockstep on NCCL beside PyTorch's DDP on
#                              NCCL (one row each), both on GPU LOCAL_RANK; BUILD=build-gpu
#                              PYTHON=python3 for another build folder and Python (docs/gpu.md)
set -euo pipefail
source "$(dirname "$0")/lib/bench.sh"
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}
STEPS=${STEPS:-40}
WARMUP=${WARMUP:-10}
NPROC=${NPROC:-2}
PRECISION=${PRECISION:-fp32}
read -r n_layer n_head n_embd block batch <<<"${SHAPE:-4 4 128 128 16}"
shape_lockstep=(--set model.n_layer="$n_layer" --set model.n_head="$n_head" --set model.n_embd="$n_embd"
                --set model.block_size="$block" --set data.batch_size="$batch" --set log.mfu="$([ "${MFU:-0}" = 1 ] && echo true || echo false)")
shape_torch=(--n_layer "$n_layer" --n_head "$n_head" --n_embd "$n_embd" --block_size "$block"
             --batch_size "$batch")
PYTHON=${PYTHON:-/usr/bin/python3}
BUILD=${BUILD:-build}
DEVICE=${DEVICE:-cpu}
case $DEVICE in
  cpu) torch_backend=gloo; device_lockstep=() ;;
  cuda) torch_backend=nccl; device_lockstep=(--set train.device=cuda --set dist.backend=nccl) ;;
  *) echo "bench_gpt: DEVICE must be cpu or cuda, not '$DEVICE'" >&2; exit 2 ;;
esac
[ -x "$BUILD/lockstep" ] || scripts/setup.sh
[ -f data/kjv.txt ] || scripts/make_text.sh
export OMP_NUM_THREADS=1 USE_LIBUV=0
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
raw="$work/raw.jsonl"
lockstep() {  # lockstep NAME LABEL ARGS...: one run; tokens/s over the intervals after the warm-up
  local name=$1 label=$2 to=${LOCKSTEP_RAW:-$raw}
  shift 2
  "$BUILD/lockstep-run" --nproc-per-node "$NPROC" --master-port 0 "$BUILD/lockstep" train \
    --config configs/gpt-text.yaml --set run.dir="$work/runs" --set run.name="$name" --set run.overwrite=true \
    --set train.max_steps=$((WARMUP + STEPS)) --set log.every="$WARMUP" --set checkpoint.every=0 \
    --set data.validation_fraction=0.001 --set train.precision="$PRECISION" "${shape_lockstep[@]}" "${device_lockstep[@]}" "$@" >"$work/out" 2>&1 || { cat "$work/out" >&2; exit 1; }
  "$PYTHON" - "$work/runs/$name/metrics.jsonl" "$label" "$WARMUP" >>"$to" <<'PY'
import json, sys
records = [json.loads(l) for l in open(sys.argv[1])]
timed = [r for r in records if "tokens_per_s" in r and r["step"] > int(sys.argv[3])]
out = {"impl": sys.argv[2], "tokens_per_s": sum(r["tokens_per_s"] for r in timed) / len(timed)}
if "flops_per_s" in timed[-1]:
    out["flops_per_token"] = timed[-1]["flops_per_s"] / timed[-1]["tokens_per_s"]
if "mfu" in timed[-1]:
    out["mfu"] = sum(r["mfu"] for r in timed) / len(timed)
ms = [r["ms"] for r in timed]  # the same interval records
out["split"] = {k: sum(m.get(k, 0) for m in ms) / len(ms)
                for k in ("forward", "backward", "comm_wait", "clip", "optimizer", "check")}
print(json.dumps(out))
PY
}
torch_run() {  # torch_run OUT ARGS...: PyTorch's side, its JSON line in OUT
  local out=$1
  shift
  { "$BUILD/lockstep-run" --nproc-per-node "$NPROC" --master-port 0 "$PYTHON" scripts/bench_gpt_torch.py \
      --text data/kjv.txt --precision "$PRECISION" --backend "$torch_backend" --device "$DEVICE" \
      "${shape_torch[@]}" --steps "$STEPS" --warmup "$WARMUP" "$@" 2>"$work/torch.err" |
      sed -n 's/^\[rank0\]: //p' >"$out"; } || true
  grep -q '"impl": "pytorch' "$out" ||
    { echo "bench_gpt: PyTorch's run printed no result:" >&2; tail -n 20 "$work/torch.err" >&2; exit 1; }
}
for round in $(seq "$ROUNDS"); do
  echo "round $round/$ROUNDS" >&2
  if [ "$DEVICE" = cuda ]; then
    lockstep nccl "lockstep (nccl, cuda)" --set check.every=0
    # train.stop_on_nonfinite reads the loss and the norm on the host each
    # step (a wait for the device); PyTorch's loop has no such check.
    if [ "${NONFINITE_ROW:-0}" = 1 ]; then
      lockstep nccl_nocheck "lockstep (nccl, no non-finite stop)" --set check.every=0 --set train.stop_on_nonfinite=false
    fi
  else
    lockstep shm "lockstep (shm)" --set check.every=0
  fi
  torch_run "$work/torch.jsonl"
  cat "$work/torch.jsonl" >>"$raw"
  [ "${ONLY:-}" = shm ] || [ "$DEVICE" = cuda ] && continue
  lockstep gloo "lockstep (gloo)" --set check.every=0 --set dist.backend=gloo
  lockstep checked "lockstep (shm, check every step)" --set check.every=1
done
"$PYTHON" - "$raw" "$ROUNDS" "$PRECISION" "$n_layer $n_head $n_embd $block $batch" "$DEVICE" "$NPROC" <<'PY'
import json, sys
from bench_stats import median, ratio
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
# On a GPU: each contender's TFLOP/s per GPU (the same model's FLOP per
# token times its tokens/s, over the ranks), and in bf16 that against the
# datasheet's dense bf16 peak (H100/H200 SXM: 989 TFLOP/s, docs/gpu.md).
DATASHEET_BF16 = 989e12
names = list(dict.fromkeys(r["impl"] for r in rows))
med = {n: median(r["tokens_per_s"] for r in rows if r["impl"] == n) for n in names}
torch = next(v for n, v in med.items() if n.startswith("pytorch"))
print(f"GPT (configs/gpt-text.yaml; n_layer n_head n_embd block batch: {sys.argv[4]}; {sys.argv[3]}), "
      f"median of {sys.argv[2]} alternating rounds, tokens/s in all")
for n in names:
    mfu = [r["mfu"] for r in rows if r["impl"] == n and "mfu" in r]
    extra = f"   MFU {100 * median(mfu):.1f}%" if mfu else ""
    fpt = [r["flops_per_token"] for r in rows if "flops_per_token" in r]
    if sys.argv[5] == "cuda" and fpt:
        per_gpu = med[n] * fpt[0] / int(sys.argv[6])
        extra += f"   {per_gpu / 1e12:.1f} TFLOP/s per GPU"
        if sys.argv[3] == "bf16":
            extra += f", {100 * per_gpu / DATASHEET_BF16:.2f}% of 989"
    print(f"{n:36} {med[n]:10.0f}   x{ratio(med[n], torch):.3f} of PyTorch's{extra}")
PY
[ "${SPLIT:-0}" = 1 ] || exit 0
# The split: one profiling pass each (SPLIT_STEPS timed steps), every phase
# timed to the device's end; lockstep without its per-step non-finite check
# (a host read PyTorch's loop does not do; NONFINITE_ROW measures it).
STEPS=${SPLIT_STEPS:-$STEPS}
LOCKSTEP_RAW=$work/split.jsonl lockstep split "lockstep" --set check.every=0 --set log.sync_timing=true \
  --set train.stop_on_nonfinite=false
torch_run "$work/torch_split.jsonl" --split
cat "$work/torch_split.jsonl" >>"$work/split.jsonl"
"$PYTHON" - "$work/split.jsonl" $((NPROC * batch * block)) <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
ours_row = next(r for r in rows if r["impl"] == "lockstep")
theirs_row = next(r for r in rows if r["impl"].startswith("pytorch"))
ours, theirs = ours_row["split"], theirs_row["split"]
# lockstep's backward excludes its end-of-backward wait for the buckets;
# PyTorch's includes DDP's: the wait is added back for a like row.
ours = dict(ours, backward=ours["backward"] + ours["comm_wait"])
print("step split, ms per step (rank 0; one pass each, every phase timed to the device's end)")
print(f"{'phase':12} {'lockstep':>10} {'PyTorch':>10} {'lockstep/PyTorch':>17}")
for k in ("forward", "backward", "clip", "optimizer"):
    print(f"{k:12} {ours[k]:10.3f} {theirs[k]:10.3f} {ours[k] / max(theirs[k], 1e-9):17.3f}")
a, b = (sum(d[k] for k in ("forward", "backward", "clip", "optimizer")) for d in (ours, theirs))
print(f"{'sum':12} {a:10.3f} {b:10.3f} {a / max(b, 1e-9):17.3f}")
# The rest of the step's wall time (this pass's tokens/s): batches, zero_grad,
# the host's work between the phases.
wa, wb = (1000 * int(sys.argv[2]) / r["tokens_per_s"] for r in (ours_row, theirs_row))
print(f"{'other':12} {wa - a:10.3f} {wb - b:10.3f}")
print(f"{'step':12} {wa:10.3f} {wb:10.3f} {wa / wb:17.3f}")
PY
