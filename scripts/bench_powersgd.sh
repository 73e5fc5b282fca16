#!/usr/bin/env bash
# Gradient compression over a slow link: two "hosts" (network namespaces
# joined by a veth pair, one rank each, Gloo between them), the link shaped
# by tc's token bucket (tbf) on both ends, for each rate in LINKS:
#   1. `lockstep bench ddp` on the benchmark MLPs: ms per step and bytes per
#      step with all-reduce, fp16 (bf16 sends as many bytes; Gloo in 1.13
#      has none) and PowerSGD ranks 1, 2, 4;
#   2. the digits trained to the end with each hook: validation accuracy,
#      ms per step, bytes per step after start_iter;
#   3. the GPT (configs/gpt-text.yaml) for GPT_STEPS steps with each hook:
#      validation loss, ms per step, bytes per step.
# Prints markdown tables (docs/performance.md, "PowerSGD").
# Needs root (ip netns, tc); nothing else may run meanwhile.
#
#   scripts/bench_powersgd.sh      (env: BUILD=build LINKS="none 1gbit 100mbit"
#                                   HOOKS="allreduce fp16 powersgd:1 powersgd:2 powersgd:4"
#                                   GPT_STEPS=60 START_ITER=10 BENCH_STEPS=20 SKIP=gpt,...)
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
BUILD=${BUILD:-build}
LINKS=${LINKS:-none 1gbit 100mbit}
HOOKS=${HOOKS:-allreduce fp16 powersgd:1 powersgd:2 powersgd:4}
GPT_STEPS=${GPT_STEPS:-60}
START_ITER=${START_ITER:-10}
BENCH_STEPS=${BENCH_STEPS:-20}
SKIP=${SKIP:-}
LOCKSTEP="$root/$BUILD/lockstep"
RUN="$root/$BUILD/lockstep-run"
if [ "$(id -u)" -ne 0 ] || ! command -v tc >/dev/null; then
  echo "bench_powersgd.sh: needs root, ip and tc (iproute2)" >&2
  exit 2
fi
[ -x "$LOCKSTEP" ] || { echo "bench_powersgd.sh: no $LOCKSTEP (scripts/setup.sh builds it)" >&2; exit 2; }
work=$(mktemp -d)
a="lpa$$" b="lpb$$" va="lpva$$" vb="lpvb$$"
cleanup() { ip netns del "$a" 2>/dev/null; ip netns del "$b" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
ip netns add "$a" && ip netns add "$b" &&
  ip link add "$va" type veth peer name "$vb" &&
  ip link set "$va" netns "$a" && ip link set "$vb" netns "$b" &&
  ip -n "$a" addr add 10.78.0.1/24 dev "$va" && ip -n "$b" addr add 10.78.0.2/24 dev "$vb" &&
  ip -n "$a" link set lo up && ip -n "$b" link set lo up &&
  ip -n "$a" link set "$va" up && ip -n "$b" link set "$vb" up ||
  { echo "bench_powersgd.sh: cannot build the two namespaces" >&2; exit 2; }
export OMP_NUM_THREADS=1 LOCKSTEP_STORE_SECRET="bench-powersgd-$$-0123456789abcdef"

shape() {  # shape RATE|none: both directions
  local ns dev
  for pair in "$a:$va" "$b:$vb"; do
    ns=${pair%%:*} dev=${pair##*:}
    tc -n "$ns" qdisc del dev "$dev" root 2>/dev/null
    if [ "$1" != none ]; then
      tc -n "$ns" qdisc add dev "$dev" root tbf rate "$1" burst 256kb latency 200ms || exit 2
    fi
  done
}
port=29700
pair() {  # pair NAME ARGS... : rank 0 in $a, rank 1 in $b; output in $work/NAME.{0,1}
  local name=$1
  shift
  port=$((port + 1))
  for rank in 0 1; do
    local ns=$a iface=$va
    [ $rank = 1 ] && ns=$b iface=$vb
    ip netns exec "$ns" env GLOO_SOCKET_IFNAME="$iface" "$RUN" --nnodes 2 --node-rank $rank \
      --nproc-per-node 1 --master-addr 10.78.0.1 --master-port $port "$LOCKSTEP" "$@" \
      >"$work/$name.$rank" 2>&1 &
  done
  wait
}
hook_args() {  # allreduce | fp16 | powersgd:R
  case $1 in
    powersgd:*) echo "--set ddp.comm_hook=powersgd --set ddp.powersgd.rank=${1#*:} --set ddp.powersgd.start_iter=$START_ITER" ;;
    *) echo "--set ddp.comm_hook=$1" ;;
  esac
}
# ms per step and bytes per step over the records after start_iter.
from_metrics() {
  /usr/bin/python3 - "$1" "$START_ITER" <<'EOF'
import json, sys
rs = [json.loads(l) for l in open(sys.argv[1]) if '"comm_bytes_per_step"' in l]
late = [r for r in rs if r["step"] > 2 * int(sys.argv[2])] or rs
ms = sum(sum(r["ms"].values()) for r in late) / len(late)
print(f"{ms:.1f} {sum(r['comm_bytes_per_step'] for r in late) / len(late) / 1024:.1f}")
EOF
}

mlp="| link | model | mode | ms/step | KiB/step |\n| --- | --- | --- | --- | --- |\n"
digits="| link | hook | val accuracy | ms/step | KiB/step |\n| --- | --- | --- | --- | --- |\n"
gpt="| link | hook | val loss | ms/step | KiB/step |\n| --- | --- | --- | --- | --- |\n"
for link in $LINKS; do
  shape "$link"
  echo "link $link" >&2
  if [[ ",$SKIP," != *,mlp,* ]]; then
    pair bench bench ddp --models small,large --steps "$BENCH_STEPS" --warmup 5 \
      --modes ddp,ddp-fp16,ddp-powersgd1,ddp-powersgd2,ddp-powersgd4
    while read -r row; do
      mlp+=$(echo "$row" | /usr/bin/python3 -c "
import json, sys
r = json.loads(sys.stdin.read())
print(f\"| $link | {r['model']} | {r['mode']} | {r['ms_per_step']:.1f} | {r['comm_bytes_per_step'] / 1024:.1f} |\")")"\n"
    done < <(grep -o '{"bench": "ddp".*' "$work/bench.0")
  fi
  for hook in $HOOKS; do
    if [[ ",$SKIP," != *,digits,* ]]; then
      # shellcheck disable=SC2046
      pair digits train --config "$root/configs/digits.yaml" --set run.dir="$work/runs" \
        --set run.name="digits-$link-$hook" --set log.progress=plain --set log.every=10 \
        --set checkpoint.every=0 $(hook_args "$hook")
      acc=$(grep -o "validation accuracy [0-9.]*" "$work/digits.0" | tail -1 | awk '{print $3}')
      read -r ms kib < <(from_metrics "$work/runs/digits-$link-$hook/metrics.jsonl")
      digits+="| $link | $hook | ${acc:-failed} | $ms | $kib |\n"
    fi
    if [[ ",$SKIP," != *,gpt,* ]]; then
      # shellcheck disable=SC2046
      pair gpt train --config "$root/configs/gpt-text.yaml" --set run.dir="$work/runs" \
        --set run.name="gpt-$link-$hook" --set log.progress=plain --set log.every=10 \
        --set train.max_steps="$GPT_STEPS" --set checkpoint.every=0 $(hook_args "$hook")
      loss=$(/usr/bin/python3 -c "
import json
rs = [json.loads(l) for l in open('$work/runs/gpt-$link-$hook/metrics.jsonl') if 'val_loss' in l]
print(f\"{rs[-1]['val_loss']:.4f}\" if rs else 'failed')" 2>/dev/null)
      read -r ms kib < <(from_metrics "$work/runs/gpt-$link-$hook/metrics.jsonl")
      gpt+="| $link | $hook | ${loss:-failed} | $ms | $kib |\n"
    fi
    echo "  $hook done" >&2
  done
done
[[ ",$SKIP," != *,mlp,* ]] && printf "%b\n" "$mlp"
[[ ",$SKIP," != *,digits,* ]] && printf "%b\n" "$digits"
[[ ",$SKIP," != *,gpt,* ]] && printf "%b\n" "$gpt"
exit 0
