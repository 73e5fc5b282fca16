#!/usr/bin/env bash
# Checkpoint cost, measured (docs/checkpoints.md): checkpoint.format
# consolidated vs sharded vs sharded + checkpoint.async, on 2 and 3 ranks,
# for two models:
#   mlp  scripts/bench_zero.sh's MLP (784, four hidden layers of 4096, 10:
#        53.6M parameters), Adam, optim.zero ZERO, synthetic data;
#   gpt  a GPT of 57.1M parameters (n_layer 8, n_embd 768, block 256, the
#        bytes of data/kjv.txt), AdamW, optim.zero ZERO.
# Per save (the trainer's own log lines): the save's time (async: from the
# step to its publication), the training pause (sync: the whole save;
# async: the copy to memory), rank 0's resident peak during it (VmHWM reset
# at the save's start). Then the step-time cost of a checkpoint every 50
# steps (MLP, STEPS steps): the time from step 1 to the last step's log
# line with checkpoint.every 50 against none (the last save comes after it
# either way), medians of ROUNDS rounds, the modes alternated.
#   scripts/bench_checkpoint.sh [BUILD_DIR]
# The cost runs are on COST_WORLD ranks only (each is STEPS MLP steps).
#   env: ROUNDS (3), STEPS (110), WORLDS ("2 3"), COST_WORLD (2), ZERO (1), MODELS ("mlp gpt")
set -euo pipefail
source "$(dirname "$0")/lib/bench.sh"
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
ROUNDS=${ROUNDS:-3} STEPS=${STEPS:-110} WORLDS=${WORLDS:-"2 3"} ZERO=${ZERO:-1}
COST_WORLD=${COST_WORLD:-2}
MODELS=${MODELS:-"mlp gpt"}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
modes=(consolidated sharded async)
mode_args() {
  case $1 in
    consolidated) echo "--set checkpoint.format=consolidated" ;;
    sharded) echo "--set checkpoint.format=sharded" ;;
    async) echo "--set checkpoint.format=sharded --set checkpoint.async=true" ;;
    none) echo "--set checkpoint.format=sharded" ;;
  esac
}
model_args() {
  case $1 in
    mlp) echo "--config $root/configs/synthetic.yaml --set model.name=mlp --set model.hidden=4096 \
      --set model.layers=4 --set data.name=synthetic --set data.synthetic_features=784 \
      --set data.synthetic_size=100000 --set data.batch_size=32 --set optim.name=adam \
      --set optim.lr=0.0001" ;;
    gpt) echo "--config $root/configs/gpt-text.yaml --set data.path=$root/data/kjv.txt \
      --set model.n_layer=8 --set model.n_embd=768 --set model.n_head=12 --set model.block_size=256 \
      --set data.batch_size=4 --set optim.name=adamw" ;;
  esac
}
run() {  # run NAME MODEL WORLD MODE STEPS EVERY
  local name=$1 model=$2 n=$3 mode=$4 steps=$5 every=$6
  # shellcheck disable=SC2046
  "$build/lockstep-run" --nproc-per-node "$n" --master-port 0 "$build/lockstep" train \
    $(model_args "$model") $(mode_args "$mode") --set run.dir="$work" --set run.name="$name" \
    --set optim.zero="$ZERO" --set train.max_steps="$steps" --set train.epochs=1000 \
    --set log.every=1 --set log.progress=plain --set check.every=0 --set train.eval_batches=1 \
    --set checkpoint.every="$every" --set checkpoint.keep=2 >"$work/$name.out" 2>&1 || {
    echo "$name failed:" >&2
    tail -20 "$work/$name.out" >&2
    exit 1
  }
  rm -rf "${work:?}/$name/checkpoints"
}
for round in $(seq 1 "$ROUNDS"); do
  order=("${modes[@]}")
  [ $((round % 2)) = 0 ] && order=(async sharded consolidated)
  for n in $WORLDS; do
    for model in $MODELS; do
      # Save figures: a periodic save (step 2) and the last (step 4).
      for mode in "${order[@]}"; do run "save-$model-$n-$mode-$round" "$model" "$n" "$mode" 4 2; done
    done
    if [[ " $MODELS " == *" mlp "* ]] && [ "$n" = "$COST_WORLD" ]; then
      for mode in none "${order[@]}"; do
        every=50
        [ "$mode" = none ] && every=0
        run "cost-$n-$mode-$round" mlp "$n" "$mode" "$STEPS" "$every"
      done
    fi
  done
done
/usr/bin/python3 - "$work" "$ROUNDS" "$WORLDS" "$MODELS" "$ZERO" "$STEPS" "$COST_WORLD" <<'PY'
import datetime, re, subprocess, sys
from bench_stats import median
work, rounds, worlds, models, zero, steps = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4].split(), sys.argv[5], int(sys.argv[6])
cost_world = sys.argv[7]
cpu = next((l.split(":", 1)[1].strip() for l in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines() if l.startswith("Model name")), "?")
sync = re.compile(r"\[rank0\].*checkpoint of step (\d+): (\w+) save took ([0-9.]+) s .*rank 0 resident ([0-9.]+) MiB at its start, peak ([0-9.]+) MiB")
paused = re.compile(r"\[rank0\].*checkpoint of step (\d+): training paused ([0-9.]+) s .*rank 0 resident ([0-9.]+) MiB at its start, peak ([0-9.]+) MiB")
done = re.compile(r"\[rank0\].*checkpoint of step (\d+): written in the background, ([0-9.]+) s after")
params = re.compile(r"with ([0-9]+) parameters")
stamp = re.compile(r"\[rank0\]: \[([0-9-]+ [0-9:.]+)\] \[info\] step (\d+)/")
med = median
print(f"CPU: {cpu}; optim.zero {zero}; medians of {rounds} rounds")
print()
print("a periodic save (step 2; async: the first, which also allocates the host buffers)")
print(f"{'model':>5} | {'ranks':>5} | {'format':>13} | {'save s':>7} | {'pause s':>7} | {'rank 0 MiB at start':>19} | {'rank 0 peak MiB':>15}")
for model in models:
    for n in worlds:
        for mode in ("consolidated", "sharded", "async"):
            save, pause, start, peak = [], [], [], []
            for r in range(1, rounds + 1):
                text = open(f"{work}/save-{model}-{n}-{mode}-{r}.out").read()
                p = params.search(text)
                for m in sync.finditer(text):
                    if int(m.group(1)) == 2:
                        save.append(float(m.group(3))); pause.append(float(m.group(3)))
                        start.append(float(m.group(4))); peak.append(float(m.group(5)))
                for m in paused.finditer(text):
                    if int(m.group(1)) == 2:
                        pause.append(float(m.group(2)))
                        start.append(float(m.group(3))); peak.append(float(m.group(4)))
                for m in done.finditer(text):
                    if int(m.group(1)) == 2:
                        save.append(float(m.group(2)))
            label = "sharded+async" if mode == "async" else mode
            print(f"{model:>5} | {n:>5} | {label:>13} | {med(save):7.3f} | {med(pause):7.3f} | {med(start):19.1f} | {med(peak):15.1f}")
        print(f"      ({p.group(1) if p else '?'} parameters)")
if "mlp" in models:
    print()
    print(f"step-time cost of a checkpoint every 50 steps (mlp, {steps} steps; the last save excluded)")
    print(f"{'ranks':>5} | {'format':>13} | {'s, step 1..last':>15} | {'cost':>7}")
    def span(path):
        t = {}
        for m in stamp.finditer(open(path).read()):
            t[int(m.group(2))] = datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S.%f")
        return (t[max(t)] - t[1]).total_seconds()
    for n in [cost_world]:
        base = med([span(f"{work}/cost-{n}-none-{r}.out") for r in range(1, rounds + 1)])
        print(f"{n:>5} | {'none':>13} | {base:15.2f} | {'':>7}")
        for mode in ("consolidated", "sharded", "async"):
            s = med([span(f"{work}/cost-{n}-{mode}-{r}.out") for r in range(1, rounds + 1)])
            label = "sharded+async" if mode == "async" else mode
            print(f"{n:>5} | {label:>13} | {s:15.2f} | {100 * (s / base - 1):+6.1f}%")
PY
