#!/usr/bin/env bash
# The shm backend's set-up on the way out (Note [Segment name]): ranks given
# different dist.shm_chunk_mb fail at once with exit 2 and leave no segment;
# rank 0 stopped by SIGTERM while it waits for the others leaves none
# either; a /dev/shm too small for the segment is exit 2 on every rank,
# naming /dev/shm, its size and the size asked. Each case has a /dev/shm of
# its own (a tmpfs in a private mount namespace), so other jobs' segments
# neither interfere nor count.
source "$(dirname "$0")/lib.sh"
if [ -z "${LOCKSTEP_SHM_NS:-}" ]; then
  if ! unshare -m true 2>/dev/null; then
    echo "skipped: a private /dev/shm needs unshare -m (root, or CAP_SYS_ADMIN)"
    exit 77
  fi
  exec unshare -m env LOCKSTEP_SHM_NS=1 bash "$0" "$@"
fi
fresh_shm() { umount /dev/shm 2>/dev/null; mount -t tmpfs -o "size=$1" tmpfs /dev/shm; }
segments() { ls /dev/shm | grep '^lockstep-' | tr '\n' ' '; }
rank() {  # rank R PORT OUT ARGS...: one rank of a 2-rank job, by hand (run with & or in ( ))
  local r=$1 port=$2 out=$3
  shift 3
  exec env RANK="$r" WORLD_SIZE=2 LOCAL_RANK="$r" LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 \
    MASTER_PORT="$port" OMP_NUM_THREADS=1 LOCKSTEP_STORE_SECRET=shm-setup-test-0123456789abcdef \
    "$LOCKSTEP" "$@" >"$out" 2>&1
}

# 1. Ranks with different chunks: rank 1 cannot map rank 0's segment, says
#    so through the store, rank 0 removes it at once; both exit 2.
fresh_shm 256m
start=$(now)
"$LOCKSTEP_RUN" --nproc-per-node 2 --master-port 0 sh -c \
  "exec \"$LOCKSTEP\" train --set run.dir=$WORK/runs --set dist.backend=shm --set dist.shm_chunk_mb=\$((RANK + 1))" \
  >"$WORK/chunks.out" 2>&1
expect_eq "$?" 2 "ranks with different dist.shm_chunk_mb: the job exits 2"
expect_lt "$(elapsed "$start")" 60 "at once, not after the timeout"
expect_grep "$WORK/chunks.out" "the ranks were given different dist.shm_chunk_mb" "saying why"
expect_eq "$(segments)" "" "and /dev/shm holds no segment afterwards, before any other job runs"

# 2. Rank 0 waits for a rank 1 that never comes, and is stopped by SIGTERM:
#    the segment goes with it.
fresh_shm 256m
p=$(free_port)
rank 0 "$p" "$WORK/alone.out" check --comm --backend shm --rdzv-timeout-s 60 &
r0=$!
# Rank 1 joins the store but builds a Gloo group: it never maps the segment.
rank 1 "$p" "$WORK/r1.out" check --comm --backend gloo --rdzv-timeout-s 60 &
r1=$!
for _ in $(seq 300); do [ -n "$(segments)" ] && break; sleep 0.1; done
have=$(segments)
[ -n "$have" ] && pass "rank 0 created its segment ($have)" || fail "rank 0 created no segment"
kill -TERM "$r0"
wait "$r0"
code=$?
expect_eq "$(segments)" "" "rank 0 stopped by SIGTERM during set-up leaves no segment"
expect_eq "$code" 143 "and dies of the SIGTERM as it would have (128 + 15)"
kill -9 "$r1" 2>/dev/null
wait "$r1" 2>/dev/null

# 3. A /dev/shm too small for the segment: every rank exits 2, naming
#    /dev/shm, its size and the size asked.
fresh_shm 1m
p=$(free_port)
rank 0 "$p" "$WORK/small0.out" check --comm --backend shm --rdzv-timeout-s 60 &
r0=$!
(rank 1 "$p" "$WORK/small1.out" check --comm --backend shm --rdzv-timeout-s 60)
c1=$?
wait "$r0"
c0=$?
expect_eq "$c0:$c1" "2:2" "a too-small /dev/shm: exit 2 on both ranks"
for r in 0 1; do
  expect_grep "$WORK/small$r.out" "/dev/shm is too small: the segment needs 1\.6 MiB \(6 chunks of 256 KiB\) and /dev/shm has [0-9.]+ (KiB|MiB) free of 1 MiB" "rank $r names /dev/shm, its size and the size asked"
done
expect_eq "$(segments)" "" "and leaves nothing in /dev/shm"

# 4. DDP's buckets in shared memory (Note [Buckets in shared memory]): with
#    room they are all-reduced in place; in a /dev/shm that holds the segment
#    but not twice the ranks' buckets, every rank keeps them private (said
#    once) and the same training gives the same bits, at 2 and 3 ranks
#    (1/3: the division folded into the in-place sum must round as the
#    multiply before the copy does).
train_digits() {  # NAME RANKS SHM-SIZE
  fresh_shm "$3"
  "$LOCKSTEP_RUN" --nproc-per-node "$2" --master-port 0 "$LOCKSTEP" train \
    --config "$(cd "$(dirname "$0")/../.." && pwd)/configs/digits.yaml" --set run.dir="$WORK/runs" --set run.name="$1" \
    --set run.overwrite=true --set log.progress=plain --set dist.backend=shm \
    --set dist.shm_chunk_mb=0.0625 --set model.hidden=512 --set train.max_steps=30 \
    --set checkpoint.every=0 \
    >"$WORK/$1.out" 2>&1
  expect_eq "$?" 0 "$1: trains"
}
for n in 2 3; do
  train_digits "shared-$n" "$n" 256m
  train_digits "private-$n" "$n" 1m
  expect_grep "$WORK/private-$n.out" "gradient buckets in private memory .*would take more than half of /dev/shm" "$n ranks, a small /dev/shm: the buckets stay private, saying why"
  expect_grep "$WORK/shared-$n.out" "gradient buckets in shared memory \(all-reduced in place\)" "$n ranks, room in /dev/shm: the buckets are shared"
  same "private-$n" "shared-$n" "$n ranks: in place and through the segment, the same final weights"
done
# LOCKSTEP_SHM_BUCKETS=0 on one rank only is its vote: every rank keeps
# private buckets (no rank waits for a buffer another never makes).
fresh_shm 256m
"$LOCKSTEP_RUN" --nproc-per-node 2 --master-port 0 sh -c \
  "[ \"\$RANK\" = 1 ] && export LOCKSTEP_SHM_BUCKETS=0; exec \"$LOCKSTEP\" train --config \"$(cd "$(dirname "$0")/../.." && pwd)/configs/digits.yaml\" --set run.dir=$WORK/runs --set run.name=vote --set run.overwrite=true --set log.progress=plain --set dist.backend=shm --set model.hidden=512 --set train.max_steps=30 --set checkpoint.every=0" \
  >"$WORK/vote.out" 2>&1
expect_eq "$?" 0 "LOCKSTEP_SHM_BUCKETS=0 on rank 1 only: trains"
expect_grep "$WORK/vote.out" "gradient buckets in private memory .*rank 1: LOCKSTEP_SHM_BUCKETS=0 is set here" "and every rank keeps private buckets, naming rank 1's setting"
same "vote" "shared-2" "with the same final weights"
expect_eq "$(segments)" "" "and nothing is left in /dev/shm"
umount /dev/shm
finish
