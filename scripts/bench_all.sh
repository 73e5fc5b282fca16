#!/usr/bin/env bash
# Every comparison of issue 43 in one run, on this machine, printed as one
# table with the CPU model: the core's matrix-product peak (lockstep bench
# matmul), the GPT demo beside PyTorch's DDP in fp32 and bf16 (bench_gpt.sh,
# all contenders, alternated, median of ROUNDS), a sweep of other GPT shapes
# at 1 and 2 ranks (lockstep's shm row beside PyTorch's, SWEEP_ROUNDS each,
# with MFU), shm's all-reduce against this machine's memory copy (and Open
# MPI's, where mpirun and an MPI-enabled build exist: the Debian 13 root),
# the DDP overhead of the small MLP rung (ddp against local, and local
# with a barrier per step), the ResNet with SyncBatchNorm beside PyTorch's
# (scripts/bench_resnet.sh), a small Llama beside transformers' under
# PyTorch's DDP (scripts/bench_llama.sh, where PYTHON has transformers), and ZeRO 0-3 and sharded checkpoints beside
# PyTorch's DDP, ZeroRedundancyOptimizer, FSDP2 and DCP (scripts/bench_peers.sh,
# where PYTHON's torch has FSDP2).
# The peer is today's PyTorch where the pip platform exists
# (scripts/test_pip.sh): PYTHON defaults to its torch 2.15 and BUILD to
# build-pip (lockstep on the same LibTorch); else Debian's python3 and build.
#   scripts/bench_all.sh                    (env: ROUNDS=3 SWEEP_ROUNDS=3 ALLREDUCE_ROUNDS=3 DDP_ROUNDS=3
#                                            BF16_STEPS=4 BF16_WARMUP=2 (cores without bf16 arithmetic);
#                                            25 min on 1.13, 41 on 2.6, 2 cores with AVX-512 BF16)
#   scripts/debian13.sh scripts/bench_all.sh   the same on LibTorch 2.6
set -euo pipefail
source "$(dirname "$0")/lib/bench.sh"
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}
SWEEP_ROUNDS=${SWEEP_ROUNDS:-3}
pip_python=${LOCKSTEP_PIP_ROOT:-/var/cache/lockstep}/torch-2.15.0/bin/python
if [ -z "${PYTHON:-}" ] && [ -x "$pip_python" ] && [ -x build-pip/lockstep ]; then
  PYTHON=$pip_python BUILD=${BUILD:-build-pip}
fi
PYTHON=${PYTHON:-/usr/bin/python3}
export BUILD=${BUILD:-build}
[ -x "$BUILD/lockstep" ] || LOCKSTEP_BUILD_DIR="$BUILD" scripts/setup.sh
[ -f data/kjv.txt ] || scripts/make_text.sh
export OMP_NUM_THREADS=1 USE_LIBUV=0
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
cores=$(nproc --all)
cpu=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
torch=$("$PYTHON" -c 'import torch; print(torch.__version__)' 2>/dev/null || echo "?")
echo "bench_all: $cpu, $cores cores, PyTorch $torch" >&2

echo "== matmul peak" >&2
"$BUILD/lockstep" bench matmul --sizes 1024 >"$out/matmul"
# A core without bf16 arithmetic (AVX2 only: no AVX-512 BF16, no AMX) runs
# bf16 products in scalar code, ~18x slower than fp32 (2.0 against 36.1
# GFLOP/s on an AMD EPYC with AVX2), in PyTorch as in lockstep: there the
# full bf16 rows would take hours. Such a core gets the demo's bf16 row
# with lockstep's shm row alone beside PyTorch's and BF16_STEPS steps
# after BF16_WARMUP, and no bf16 sweep; the report says so.
slow_bf16=$("$PYTHON" - "$out/matmul" <<'PY'
import json, sys
peak = {r["dtype"]: r["gflops"] for r in map(json.loads, open(sys.argv[1]))}
print(1 if peak["bf16"] * 4 < peak["fp32"] else 0)
PY
)
precisions="fp32 bf16"
[ "$slow_bf16" = 1 ] && precisions="fp32"

for p in fp32 bf16; do
  echo "== GPT demo, $p" >&2
  if [ "$p" = bf16 ] && [ "$slow_bf16" = 1 ]; then
    PYTHON=$PYTHON PRECISION=$p ROUNDS=$ROUNDS MFU=1 ONLY=shm STEPS=${BF16_STEPS:-4} WARMUP=${BF16_WARMUP:-2} \
      scripts/bench_gpt.sh >"$out/demo_$p"
  else
    PYTHON=$PYTHON PRECISION=$p ROUNDS=$ROUNDS MFU=1 scripts/bench_gpt.sh >"$out/demo_$p"
  fi
done

# n_layer n_head n_embd block batch: the demo's neighbours, smaller and larger.
shapes=("2 2 64 64 32" "4 4 256 128 8" "6 6 384 128 4" "4 4 256 512 4" "8 4 128 256 8")
for nproc in 1 2; do
  for p in $precisions; do
    for s in "${shapes[@]}"; do
      echo "== sweep: $s, $p, $nproc rank(s)" >&2
      PYTHON=$PYTHON SHAPE="$s" PRECISION=$p NPROC=$nproc ONLY=shm MFU=1 ROUNDS=$SWEEP_ROUNDS STEPS=20 WARMUP=5 \
        scripts/bench_gpt.sh >"$out/sweep_${nproc}_${p}_${s// /_}"
    done
  done
done

echo "== all-reduce" >&2
# ALLREDUCE_ROUNDS runs, each with its own memory-copy reference; the
# report takes per-size medians of the ratios (and of Open MPI's against
# shm's times) over the runs.
for r in $(seq "${ALLREDUCE_ROUNDS:-3}"); do
  "$BUILD/lockstep-run" --nproc-per-node 2 --master-port 0 "$BUILD/lockstep" bench allreduce --backends shm \
    --min-bytes 4096 --max-bytes 67108864 --iters 100 2>/dev/null | sed -n 's/^\[rank0\]: //p' >"$out/allreduce_$r"
  # Each rank on its own core, as mpirun binds by default (the shm
  # contender included: both run in the same processes). Unbound, the two
  # ranks sometimes start on one core, and the first size timed (shm's 4
  # KiB) caught it: 216 us in 2 of 20 runs (docs/performance.md). Where
  # Open MPI sees fewer than 2 cores (hardware threads, a cpuset), binding
  # fails: then unbound, with --oversubscribe.
  port=$("$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  mpi_run() {
    mpirun --allow-run-as-root "$@" -np 2 -x OMP_NUM_THREADS \
      -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT="$port" "$BUILD/lockstep" bench allreduce --backends shm,mpi \
      --min-bytes 4096 --max-bytes 67108864 --iters 100 2>/dev/null | grep -v '\[info\]' >"$out/mpi_$r"
  }
  if command -v mpirun >/dev/null && { mpi_run --bind-to core || mpi_run --oversubscribe; }; then
    :
  else
    rm -f "$out/mpi_$r"
  fi
done

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
  "$BUILD/lockstep-run" --nproc-per-node 2 --master-port 0 "$BUILD/lockstep" bench ddp --models small \
    --modes "$modes" --steps 3000 --warmup 100 --interleave 50 2>/dev/null |
    sed -n 's/^\[rank0\]: //p' | grep '"bench"' | sed "s/^{/{\"job\": $r, /" >>"$out/ddp"
done

echo "== ResNet with SyncBatchNorm" >&2
PYTHON=$PYTHON ROUNDS=$ROUNDS scripts/bench_resnet.sh >"$out/resnet" 2>"$out/resnet.err" ||
  { echo "scripts/bench_resnet.sh failed (exit $?); its last lines:"; tail -n 12 "$out/resnet.err"; } >>"$out/resnet"

if "$PYTHON" -c 'import transformers' 2>/dev/null; then
  echo "== Llama beside transformers' under PyTorch's DDP" >&2
  PYTHON=$PYTHON ROUNDS=$ROUNDS scripts/bench_llama.sh >"$out/llama" 2>"$out/llama.err" ||
    { echo "scripts/bench_llama.sh failed (exit $?); its last lines:"; tail -n 12 "$out/llama.err"; } >>"$out/llama"
fi

if "$PYTHON" -c 'from torch.distributed.fsdp import fully_shard' 2>/dev/null; then
  echo "== ZeRO and checkpoints beside PyTorch" >&2
  # A failure here is reported in its section; the figures above stand.
  PYTHON=$PYTHON ROUNDS=${PEER_ROUNDS:-2} scripts/bench_peers.sh >"$out/peers" 2>"$out/peers.err" ||
    { echo "scripts/bench_peers.sh failed (exit $?); its last lines:"; tail -n 12 "$out/peers.err"; } >>"$out/peers"
fi

"$PYTHON" - "$out" "$cpu" "$torch" "$slow_bf16" "${BF16_STEPS:-4}" "${BF16_WARMUP:-2}" <<'PY'
import glob, json, os, re, sys
from bench_stats import median
out, cpu, torch, slow_bf16, bf16_steps, bf16_warmup = sys.argv[1:7]
print(f"## bench_all: {cpu}, PyTorch {torch}")
print("\n### Matrix-product peak (one core, 1024^3)")
for l in open(f"{out}/matmul"):
    r = json.loads(l)
    print(f"- {r['dtype']}: {r['gflops']:.1f} GFLOP/s")
if slow_bf16 == "1":
    print("- bf16 under a quarter of fp32: this core has no bf16 arithmetic, so the bf16 demo row "
          f"is lockstep's shm row alone beside PyTorch's, {bf16_steps} steps after {bf16_warmup}, "
          "and the sweep is fp32 only")
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
def table(path):
    """A `bench allreduce` table: bytes -> {contender: (us, busbw)}, by the header's names."""
    names, rows = [], {}
    for l in open(path):
        parts = [p.split() for p in l.split("|")]
        if parts[0][:2] == ["bytes", "elements"]:
            names = [p[0] for p in parts[1:-1]]
        elif names and re.match(r"\s*\d+\s+\d+\s+\|", l):
            rows[int(parts[0][0])] = {n: (float(p[0]), float(p[1])) for n, p in zip(names, parts[1:-1])}
    return rows
runs = sorted(glob.glob(f"{out}/allreduce_*"))
print(f"\n### shm all-reduce (2 ranks), {len(runs)} runs; the first:")
print("".join("    " + l for l in open(runs[0])))
# Against two copies of the same run: the tensor copy (the issue's "memcpy")
# and the copy limit, the faster of it and a streaming copy (docs/performance.md,
# "Which copy is the limit").
for path, name in (("shm", "private tensors"), ("shm-bkt", "DDP's bucket memory")):
    for ref in ("memcpy", "the copy limit"):
        ratios, small, each = {}, [], []  # bytes -> busbw / copy per run; 4 KiB us; each run's worst
        streamed_runs = 0  # runs that printed a streaming copy
        for f in runs:
            text = open(f).read()
            copy = re.search(r"\(one \d+-byte tensor copy\): ([0-9.]+) GB/s", text)
            streamed = re.search(r"streaming stores\): ([0-9.]+) GB/s", text)
            rows = table(f)
            if not copy or not rows:
                continue
            limit = float(copy.group(1))
            if ref != "memcpy" and streamed:
                limit = max(limit, float(streamed.group(1)))
                streamed_runs += 1
            mine = {size: cells[path][1] / limit for size, cells in rows.items() if size >= 1 << 20}
            for size, ratio in mine.items():
                ratios.setdefault(size, []).append(ratio)
            each.append(min(mine.values()))
            small.append(rows[4096][path][0])
        if not ratios:
            continue
        med = {size: median(v) for size, v in ratios.items()}
        worst = min(med, key=med.get)
        print(f"shm, {name}: busbw / {ref} at >= 1 MiB, per-size medians of {len(each)} runs: "
              f"worst {med[worst]:.2f} (at {worst >> 20} MiB; each run's worst: "
              f"{', '.join(f'{v:.2f}' for v in each)}); "
              f"4 KiB latency {min(small):.1f}-{max(small):.1f} us over the runs"
              + (f" (streaming copy in {streamed_runs} of {len(each)} runs; the tensor copy in the others)"
                 if ref != "memcpy" and streamed_runs < len(each) else ""))
mpis = sorted(glob.glob(f"{out}/mpi_*"))
print("\n### Open MPI")
if not mpis:
    print("(no Open MPI contender: mpirun or an MPI-enabled build is missing here)")
else:
    print(f"{len(mpis)} runs; the first:")
    print("".join("    " + l for l in open(mpis[0])))
    behind = {}
    for f in mpis:
        for size, cells in table(f).items():
            if cells["shm"][0] > cells["mpi"][0]:
                behind[size] = behind.get(size, 0) + 1
    sizes = len(table(mpis[0]))
    print(f"private shm slower than Open MPI at {len(behind)} of {sizes} sizes in at least one run"
          + (": " + ", ".join(f"{s} B ({n} of {len(mpis)})" for s, n in sorted(behind.items())) if behind else ""))
ddp = [json.loads(l) for l in open(f"{out}/ddp")]
jobs = sorted({r["job"] for r in ddp})
block = ddp[0]["interleave"]
ms = {(r["job"], r["mode"]): r["ms_per_step"] for r in ddp}
over = [ms[(k, "ddp")] / ms[(k, "local")] for k in jobs]
kept = [ms[(k, "local+barrier")] / ms[(k, "local")] for k in jobs]
print(f"\n### DDP overhead, small rung (784-128-128-10, batch 32, 2 ranks), "
      f"modes interleaved in blocks of {block} steps, {len(jobs)} jobs")
print(f"ddp / local, median of the jobs' ratios: x{median(over):.3f} "
      f"(jobs: {', '.join(f'{v:.3f}' for v in over)}); "
      f"local+barrier / local (keeping in step, nothing exchanged): x{median(kept):.3f} "
      f"(jobs: {', '.join(f'{v:.3f}' for v in kept)}); medians of the ms per step: "
      f"local {median(ms[(k, 'local')] for k in jobs):.4f}, "
      f"local+barrier {median(ms[(k, 'local+barrier')] for k in jobs):.4f}, "
      f"ddp {median(ms[(k, 'ddp')] for k in jobs):.4f}")
print("\n### ResNet with synchronised batch normalisation beside PyTorch (scripts/bench_resnet.sh)")
print("".join("    " + l for l in open(f"{out}/resnet")))
print("\n### The tiny Llama beside transformers' under PyTorch's DDP (scripts/bench_llama.sh)")
if os.path.exists(f"{out}/llama"):
    print("".join("    " + l for l in open(f"{out}/llama")))
else:
    print("(no peer: this Python has no transformers; scripts/test_pip.sh makes one that has)")
print("\n### ZeRO and sharded checkpoints beside PyTorch (scripts/bench_peers.sh)")
if os.path.exists(f"{out}/peers"):
    print("".join("    " + l for l in open(f"{out}/peers")))
else:
    print("(no peer: this Python's torch has no FSDP2; scripts/test_pip.sh makes one)")
PY
