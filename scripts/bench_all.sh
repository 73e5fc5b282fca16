#!/usr/bin/env bash
# Every comparison of issue 43 in one run, on this machine, printed as one
# table with the CPU model: the core's matrix-product peak (lockstep bench
# matmul), the GPT demo beside PyTorch's DDP in fp32 and bf16 (bench_gpt.sh,
# all contenders, alternated, median of ROUNDS), a sweep of other GPT shapes
# at 1 and 2 ranks (lockstep's shm row beside PyTorch's, SWEEP_ROUNDS each,
# with MFU), shm's all-reduce against this machine's memory copy (and Open
# MPI's, where mpirun and an MPI-enabled build exist: the Debian 13 root),
# and the DDP overhead of the small MLP rung (ddp against local, and local
# with a barrier per step).
#   scripts/bench_all.sh                    (env: ROUNDS=3 SWEEP_ROUNDS=3 DDP_ROUNDS=3; 23 min on 1.13, 37 on 2.6, 2 cores)
#   scripts/debian13.sh scripts/bench_all.sh   the same on LibTorch 2.6
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}
SWEEP_ROUNDS=${SWEEP_ROUNDS:-3}
PYTHON=${PYTHON:-/usr/bin/python3}
[ -x build/lockstep ] || scripts/setup.sh
[ -f data/kjv.txt ] || scripts/make_text.sh
export OMP_NUM_THREADS=1 USE_LIBUV=0
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
cores=$(nproc --all)
cpu=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
torch=$("$PYTHON" -c 'import torch; print(torch.__version__)' 2>/dev/null || echo "?")
echo "bench_all: $cpu, $cores cores, PyTorch $torch" >&2

echo "== matmul peak" >&2
build/lockstep bench matmul --sizes 1024 >"$out/matmul"

for p in fp32 bf16; do
  echo "== GPT demo, $p" >&2
  PRECISION=$p ROUNDS=$ROUNDS MFU=1 scripts/bench_gpt.sh >"$out/demo_$p"
done

# n_layer n_head n_embd block batch: the demo's neighbours, smaller and larger.
shapes=("2 2 64 64 32" "4 4 256 128 8" "6 6 384 128 4" "4 4 256 512 4" "8 4 128 256 8")
for nproc in 1 2; do
  for p in fp32 bf16; do
    for s in "${shapes[@]}"; do
      echo "== sweep: $s, $p, $nproc rank(s)" >&2
      SHAPE="$s" PRECISION=$p NPROC=$nproc ONLY=shm MFU=1 ROUNDS=$SWEEP_ROUNDS STEPS=20 WARMUP=5 \
        scripts/bench_gpt.sh >"$out/sweep_${nproc}_${p}_${s// /_}"
    done
  done
done

echo "== all-reduce" >&2
build/lockstep-run --nproc-per-node 2 --master-port 0 build/lockstep bench allreduce --backends shm \
  --min-bytes 4096 --max-bytes 67108864 --iters 100 2>/dev/null | sed -n 's/^\[rank0\]: //p' >"$out/allreduce"
port=$("$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
if command -v mpirun >/dev/null && mpirun --allow-run-as-root --oversubscribe -np 2 -x OMP_NUM_THREADS \
  -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT="$port" build/lockstep bench allreduce --backends shm,mpi \
  --min-bytes 4096 --max-bytes 67108864 --iters 100 2>/dev/null | grep -v '\[info\]' >"$out/mpi"; then
  :
else
  echo "(no Open MPI contender: mpirun or an MPI-enabled build is missing here)" >"$out/mpi"
fi

echo "== DDP small rung" >&2
# The three modes in one job, interleaved (Note [Interleaved modes],
# cmd_bench.cpp: blocks of 50 steps in turn, so that every mode meets the
# host's same fast and slow stretches), DDP_ROUNDS jobs, the order reversed
# every other one. local+barrier: the model alone with a barrier per step,
# the part of the overhead that is keeping the ranks in step rather than
# the exchange.
for r in $(seq "${DDP_ROUNDS:-3}"); do
  modes="local,local+barrier,ddp"
  [ $((r % 2)) -eq 0 ] && modes="ddp,local+barrier,local"
  build/lockstep-run --nproc-per-node 2 --master-port 0 build/lockstep bench ddp --models small \
    --modes "$modes" --steps 3000 --warmup 100 --interleave 50 2>/dev/null |
    sed -n 's/^\[rank0\]: //p' | grep '"bench"' | sed "s/^{/{\"job\": $r, /" >>"$out/ddp"
done

"$PYTHON" - "$out" "$cpu" "$torch" <<'PY'
import glob, json, os, re, statistics, sys
out, cpu, torch = sys.argv[1:4]
print(f"## bench_all: {cpu}, PyTorch {torch}")
print("\n### Matrix-product peak (one core, 1024^3)")
for l in open(f"{out}/matmul"):
    r = json.loads(l)
    print(f"- {r['dtype']}: {r['gflops']:.1f} GFLOP/s")
print("\n### GPT demo beside PyTorch's DDP (2 ranks)")
for p in ("fp32", "bf16"):
    print(f"\n{p}:")
    print("".join("    " + l for l in open(f"{out}/demo_{p}")))
print("### Sweep (lockstep shm beside PyTorch DDP gloo; n_layer n_head n_embd block batch)")
print("| ranks | precision | shape | lockstep tok/s | PyTorch tok/s | ratio | MFU |")
print("| ---: | --- | --- | ---: | ---: | ---: | ---: |")
for f in sorted(glob.glob(f"{out}/sweep_*")):
    text = open(f).read()
    nproc, p = os.path.basename(f).split("_")[1:3]
    shape = re.search(r"batch: ([0-9 ]+);", text).group(1)
    ls = re.search(r"lockstep \(shm\) +(\d+) +x([0-9.]+) of PyTorch's(?: +MFU ([0-9.]+)%)?", text)
    pt = re.search(r"pytorch \(gloo\) +(\d+)", text)
    print(f"| {nproc} | {p} | {shape} | {ls.group(1)} | {pt.group(1)} | {ls.group(2)} | {ls.group(3) or '-'}% |")
print("\n### shm all-reduce (2 ranks)")
print("".join("    " + l for l in open(f"{out}/allreduce")))
rows = [l.split() for l in open(f"{out}/allreduce") if re.match(r"\s*\d+\s+\d+\s+\|", l)]
copy = re.search(r"\(one \d+-byte tensor copy\): ([0-9.]+) GB/s", open(f"{out}/allreduce").read())
if copy and rows:
    memcpy = float(copy.group(1))
    # Columns: bytes elements | shm us busbw | shm-bkt us busbw | check
    for name, us, bw in (("private tensors", 3, 4), ("DDP's bucket memory", 6, 7)):
        worst = min(float(r[bw]) / memcpy for r in rows if int(r[0]) >= 1 << 20)
        small = next(float(r[us]) for r in rows if int(r[0]) == 4096)
        print(f"shm, {name}: busbw / memcpy at >= 1 MiB: worst {worst:.2f}; 4 KiB latency {small:.1f} us")
print("\n### Open MPI")
print("".join("    " + l for l in open(f"{out}/mpi")))
ddp = [json.loads(l) for l in open(f"{out}/ddp")]
jobs = sorted({r["job"] for r in ddp})
block = ddp[0]["interleave"]
ms = {(r["job"], r["mode"]): r["ms_per_step"] for r in ddp}
over = [ms[(k, "ddp")] / ms[(k, "local")] for k in jobs]
kept = [ms[(k, "local+barrier")] / ms[(k, "local")] for k in jobs]
print(f"\n### DDP overhead, small rung (784-128-128-10, batch 32, 2 ranks), "
      f"modes interleaved in blocks of {block} steps, {len(jobs)} jobs")
print(f"ddp / local, median of the jobs' ratios: x{statistics.median(over):.3f} "
      f"(jobs: {', '.join(f'{v:.3f}' for v in over)}); "
      f"local+barrier / local (keeping in step, nothing exchanged): x{statistics.median(kept):.3f} "
      f"(jobs: {', '.join(f'{v:.3f}' for v in kept)}); medians of the ms per step: "
      f"local {statistics.median(ms[(k, 'local')] for k in jobs):.4f}, "
      f"local+barrier {statistics.median(ms[(k, 'local+barrier')] for k in jobs):.4f}, "
      f"ddp {statistics.median(ms[(k, 'ddp')] for k in jobs):.4f}")
PY
