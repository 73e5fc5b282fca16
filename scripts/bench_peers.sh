#!/usr/bin/env bash
# ZeRO and sharded checkpoints beside PyTorch's own (docs/performance.md):
# scripts/bench_zero.sh's MLP (784, LAYERS hidden layers of HIDDEN, 10;
# Adam, batch 32 per rank, synthetic data) on NPROC ranks over Gloo, one
# thread each, lockstep and PyTorch alternated over ROUNDS rounds:
#   optim.zero 0  beside DistributedDataParallel
#   optim.zero 1  beside DDP + ZeroRedundancyOptimizer
#   optim.zero 2  beside FSDP2 fully_shard(reshard_after_forward=False)
#   optim.zero 3  beside FSDP2 fully_shard(reshard_after_forward=True)
# (scripts/bench_zero_torch.py): the median step time and each rank's peak
# resident memory. Then a save after step 2 of optim.zero 3's state:
# checkpoint.format sharded (and + checkpoint.async) beside
# torch.distributed.checkpoint's save (and async_save), the save's time and
# the training pause.
#   scripts/bench_peers.sh      env: PYTHON (a Python with torch 2.x and FSDP2;
#                               default the pip platform's), BUILD (build-pip if
#                               it exists, else build), ROUNDS (2), STEPS (10),
#                               NPROC (2), HIDDEN (4096), LAYERS (4)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
source "$root/scripts/lib/bench.sh"
PYTHON=${PYTHON:-${LOCKSTEP_PIP_ROOT:-/var/cache/lockstep}/torch-2.15.0/bin/python}
BUILD=${BUILD:-$([ -x "$root/build-pip/lockstep" ] && echo "$root/build-pip" || echo "$root/build")}
ROUNDS=${ROUNDS:-2} STEPS=${STEPS:-10} NPROC=${NPROC:-2} HIDDEN=${HIDDEN:-4096} LAYERS=${LAYERS:-4}
"$PYTHON" -c 'from torch.distributed.fsdp import fully_shard' 2>/dev/null ||
  { echo "bench_peers: $PYTHON has no torch with FSDP2 (scripts/test_pip.sh makes one)" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1 USE_LIBUV=0
launch=("$BUILD/lockstep-run" --nproc-per-node "$NPROC" --master-port 0)

lockstep() {  # lockstep NAME ZERO [--set ...]: one run, its log in NAME.out
  local name=$1 z=$2
  shift 2
  "${launch[@]}" "$BUILD/lockstep" train --config "$root/configs/synthetic.yaml" \
    --set run.dir="$work" --set run.name="$name" --set model.name=mlp \
    --set model.hidden="$HIDDEN" --set model.layers="$LAYERS" --set data.name=synthetic \
    --set data.synthetic_features=784 --set data.synthetic_size=4096 --set data.batch_size=32 \
    --set optim.name=adam --set optim.lr=0.0001 --set optim.zero="$z" --set train.epochs=1000 \
    --set log.every=1 --set log.progress=plain --set check.every=0 --set dist.backend=gloo \
    "$@" >"$work/$name.out" 2>&1 || bench_fail "$work/$name.out"
}
torch() {  # torch NAME ARGS...: one run, its JSON line in NAME.json
  local name=$1
  shift
  "${launch[@]}" "$PYTHON" "$root/scripts/bench_zero_torch.py" --hidden "$HIDDEN" --layers "$LAYERS" \
    "$@" >"$work/$name.out" 2>&1 || bench_fail "$work/$name.out"
  sed -n 's/^\[rank0\]: \({.*}\)$/\1/p' "$work/$name.out" >"$work/$name.json"
}

for round in $(seq 1 "$ROUNDS"); do
  stages="0 1 2 3"
  [ $((round % 2)) = 0 ] && stages="3 2 1 0"
  for z in $stages; do
    echo "== round $round: optim.zero $z" >&2
    if [ $((round % 2)) = 1 ]; then
      lockstep "l$z-$round" "$z" --set train.max_steps="$STEPS" --set checkpoint.every=0
      torch "t$z-$round" --mode "$([ "$z" = 0 ] && echo ddp || echo "zero$z")" --steps "$STEPS"
    else
      torch "t$z-$round" --mode "$([ "$z" = 0 ] && echo ddp || echo "zero$z")" --steps "$STEPS"
      lockstep "l$z-$round" "$z" --set train.max_steps="$STEPS" --set checkpoint.every=0
    fi
  done
  echo "== round $round: saves" >&2
  saves=(sharded async dcp dcp-async)
  [ $((round % 2)) = 0 ] && saves=(dcp-async dcp async sharded)
  for s in "${saves[@]}"; do
    case $s in
      sharded) lockstep "s$s-$round" 3 --set train.max_steps=4 --set checkpoint.every=2 \
                 --set checkpoint.format=sharded ;;
      async) lockstep "s$s-$round" 3 --set train.max_steps=4 --set checkpoint.every=2 \
               --set checkpoint.format=sharded --set checkpoint.async=true ;;
      *) torch "s$s-$round" --mode zero3 --steps 4 --save "$s" --save-dir "$work/s$s-$round.dcp" ;;
    esac
    rm -rf "$work/s$s-$round" "$work/s$s-$round.dcp"
  done
done

"$PYTHON" - "$work" "$ROUNDS" "$NPROC" "$(bench_cpu)" <<'PY'
import json, re, sys
from bench_stats import median, ratio
work, rounds, nproc, cpu = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
med = median
mem = re.compile(r"\[rank(\d+)\].*memory: optimizer state ([0-9.]+) MiB .*peak resident ([0-9.]+) MiB while training")
def lockstep_run(name):
    text = open(f"{work}/{name}.out").read()
    peak = {}
    for m in mem.finditer(text):
        peak[int(m.group(1))] = float(m.group(3))
    ms = []
    for line in open(f"{work}/{name}/metrics.jsonl"):
        rec = json.loads(line)
        if "ms" in rec and rec.get("step", 0) > 2:
            ms.append(sum(rec["ms"][k] for k in ("forward", "backward", "comm_wait", "clip", "optimizer")))
    return med(ms), max(peak.values())
def torch_run(name):
    return json.load(open(f"{work}/{name}.json"))
version = torch_run("t0-1")["torch"]
print(f"CPU: {cpu}; {nproc} ranks over Gloo, one thread each; PyTorch {version}; medians of {rounds} rounds")
print(f"MLP of {torch_run('t0-1')['parameters']} parameters, Adam, batch 32 per rank")
print()
peers = {0: "DDP", 1: "DDP + ZeroRedundancyOptimizer", 2: "FSDP2 (no reshard after forward)", 3: "FSDP2 fully_shard"}
print(f"{'optim.zero':>10} | {'PyTorch':>32} | {'step ms':>15} | {'lockstep/PyTorch':>16} | {'peak MiB/rank':>17}")
for z in range(4):
    l = [lockstep_run(f"l{z}-{r}") for r in range(1, rounds + 1)]
    t = [torch_run(f"t{z}-{r}") for r in range(1, rounds + 1)]
    lms, tms = med(x[0] for x in l), med(x["step_ms"] for x in t)
    lpk, tpk = med(x[1] for x in l), med(max(x["peak_mib"]) for x in t)
    print(f"{z:>10} | {peers[z]:>32} | {lms:6.1f} / {tms:6.1f} | {ratio(lms, tms):15.2f}x | {lpk:7.0f} / {tpk:7.0f}")
print("(step ms and peak resident MiB: lockstep / PyTorch)")
print()
sync = re.compile(r"\[rank0\].*checkpoint of step 2: \w+ save took ([0-9.]+) s")
paused = re.compile(r"\[rank0\].*checkpoint of step 2: training paused ([0-9.]+) s")
done = re.compile(r"\[rank0\].*checkpoint of step 2: written in the background, ([0-9.]+) s after")
def lockstep_save(name):
    text = open(f"{work}/{name}.out").read()
    if m := sync.search(text):
        return float(m.group(1)), float(m.group(1))
    return float(done.search(text).group(1)), float(paused.search(text).group(1))
print("a save after step 2 of optim.zero 3 / FSDP2 (model and Adam state, every rank its shard)")
print(f"{'lockstep':>22} | {'save s':>7} | {'pause s':>7} || {'PyTorch DCP':>12} | {'save s':>7} | {'pause s':>7}")
for mine, theirs, label in (("sharded", "dcp", "save"), ("async", "dcp-async", "async_save")):
    l = [lockstep_save(f"s{mine}-{r}") for r in range(1, rounds + 1)]
    t = [torch_run(f"s{theirs}-{r}") for r in range(1, rounds + 1)]
    name = "sharded" if mine == "sharded" else "sharded + async"
    print(f"{name:>22} | {med(x[0] for x in l):7.3f} | {med(x[1] for x in l):7.3f} || {label:>12} | "
          f"{med(x['save_s'] for x in t):7.3f} | {med(x['pause_s'] for x in t):7.3f}")
PY
