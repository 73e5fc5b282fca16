#!/usr/bin/env bash
# Two "hosts" on one machine: two network namespaces joined by a veth pair,
# one node (one lockstep-run) in each, rendezvous over the veth addresses.
# 1. A 2-node training run finishes with the same weights on both nodes.
# 2. Cutting the link mid-run makes both sides fail within the collective
#    timeout (+ roll call + margin) with a clear message, and nothing is left
#    running. Needs root (ip netns); exits 77 (skipped) without it.
source "$(dirname "$0")/lib.sh"
root=$(cd "$(dirname "$0")/../.." && pwd)
if [ "$(id -u)" -ne 0 ] || ! command -v ip >/dev/null; then
  echo "skipped: needs root and iproute2"
  exit 77
fi
a="lsa$$" b="lsb$$" va="lsva$$" vb="lsvb$$"
cleanup() { ip netns del "$a" 2>/dev/null; ip netns del "$b" 2>/dev/null; rm -rf "$WORK"; }
trap cleanup EXIT
setup_network() {
  ip netns add "$a" && ip netns add "$b" &&
    ip link add "$va" type veth peer name "$vb" &&
    ip link set "$va" netns "$a" && ip link set "$vb" netns "$b" &&
    ip -n "$a" addr add 10.77.0.1/24 dev "$va" && ip -n "$b" addr add 10.77.0.2/24 dev "$vb" &&
    ip -n "$a" link set lo up && ip -n "$b" link set lo up &&
    ip -n "$a" link set "$va" up && ip -n "$b" link set "$vb" up
}
# A sandbox without network namespaces or veth pairs: skipped, not failed.
setup_network 2>"$WORK/ip.err" || { echo "skipped: cannot build the two namespaces: $(cat "$WORK/ip.err")"; exit 77; }

# Several nodes share one store secret (lockstep-run makes one only for a
# single node); without it lockstep-run refuses to start.
unset LOCKSTEP_STORE_SECRET
"$LOCKSTEP_RUN" --nnodes 2 --node-rank 1 --master-addr 10.77.0.1 true 2>"$WORK/nosecret.err"
expect_eq "$?" "2" "a 2-node launch without LOCKSTEP_STORE_SECRET exits 2"
expect_grep "$WORK/nosecret.err" "needs LOCKSTEP_STORE_SECRET in the environment, the same on every node" "and says what to set"
export LOCKSTEP_STORE_SECRET=two-hosts-test-secret-$$-0123456789

node() {  # node NS IFACE RANK OUT ARGS...
  local ns=$1 iface=$2 rank=$3 out=$4
  shift 4
  ip netns exec "$ns" env GLOO_SOCKET_IFNAME="$iface" "$LOCKSTEP_RUN" --nnodes 2 --node-rank "$rank" \
    --nproc-per-node 1 --master-addr 10.77.0.1 --master-port 29631 --grace-s 2 \
    "$LOCKSTEP" train --config "$root/configs/digits.yaml" --set run.dir="$WORK/runs" \
    --set dist.timeout_s=5 --set dist.rdzv_timeout_s=30 "$@" >"$out" 2>&1
}

# 1. A healthy 2-node run.
node "$a" "$va" 0 "$WORK/a.out" --set train.max_steps=40 &
pa=$!
node "$b" "$vb" 1 "$WORK/b.out" --set train.max_steps=40 &
pb=$!
wait $pa; ca=$?
wait $pb; cb=$?
expect_eq "$ca:$cb" "0:0" "both nodes finish"
expect_grep "$WORK/a.out" "rank 0/2 \(local 0/1, node 0\).*master 10.77.0.1:29631" "node 0 is rank 0 of 2"
expect_grep "$WORK/b.out" "rank 1/2 \(local 0/1, node 1\)" "node 1 is rank 1 of 2"
wa=$(sed -n 's/.*done: .* final weights \([0-9a-f]*\)$/\1/p' "$WORK/a.out")
wb=$(sed -n 's/.*done: .* final weights \([0-9a-f]*\)$/\1/p' "$WORK/b.out")
[ -n "$wa" ] && expect_eq "$wb" "$wa" "both nodes end with the same weights"

# 1b. Two ranks per host: auto picks the hierarchical backend (shm inside each
#     namespace, Gloo between the two leaders); the comm check's 55 cases,
#     each against its closed form, pass on all four ranks.
check_node() {  # check_node NS IFACE RANK OUT
  ip netns exec "$1" env GLOO_SOCKET_IFNAME="$2" "$LOCKSTEP_RUN" --nnodes 2 --node-rank "$3" \
    --nproc-per-node 2 --master-addr 10.77.0.1 --master-port 29632 --grace-s 2 \
    "$LOCKSTEP" check --comm --timeout-s 30 --rdzv-timeout-s 30 >"$4" 2>&1
}
check_node "$a" "$va" 0 "$WORK/ha.out" &
pa=$!
check_node "$b" "$vb" 1 "$WORK/hb.out" &
pb=$!
wait $pa; ca=$?
wait $pb; cb=$?
expect_eq "$ca:$cb" "0:0" "the 2 x 2 comm check passes on both hosts"
expect_grep "$WORK/ha.out" "auto chose hierarchical \(4 ranks, shm inside each host, gloo between hosts\)" "auto chose hierarchical"
expect_grep "$WORK/ha.out" "comm check \(hierarchical, 4 ranks\): 55 passed, 0 failed" "55 of 55 cases on 4 ranks"

# 2. Cut the link mid-run.
node "$a" "$va" 0 "$WORK/a2.out" --set run.name=cut --set train.epochs=1000 &
pa=$!
node "$b" "$vb" 1 "$WORK/b2.out" --set run.name=cut --set train.epochs=1000 &
pb=$!
wait_for 120 "step 20 before the cut" grep -q "step 20/" "$WORK/a2.out"
# Rank 0's store listens on MASTER_ADDR only, not on every interface.
ip netns exec "$a" ss -Hltn "sport = :29631" >"$WORK/listen"
expect_grep "$WORK/listen" "10\.77\.0\.1:29631" "the store listens on MASTER_ADDR (10.77.0.1)"
if grep -qE "(\*|0\.0\.0\.0|\[::\]):29631" "$WORK/listen"; then fail "the store also listens on every interface"; else pass "and on no other address"; fi
ip -n "$a" link set "$va" down
start=$(now)
wait $pa; ca=$?
wait $pb; cb=$?
took=$(elapsed "$start")
expect_lt "$took" 25 "both sides give up within timeout (5 s) + roll call + margin"
[ "$ca" -ne 0 ] && [ "$cb" -ne 0 ] && pass "both launchers exit non-zero ($ca, $cb)" || fail "exit codes $ca, $cb"
expect_grep "$WORK/a2.out" "rank 0: .*failed: .*rank\(s\) 1 did not answer the roll call" "node 0 names rank 1 as cut off"
expect_grep "$WORK/b2.out" "rank 1: .*failed: .*(store|rank\(s\) 0)" "node 1 reports the store or rank 0 unreachable"
sleep 0.5
expect_eq "$(pgrep -f "$WORK/runs" || true)" "" "nothing left running"
finish
