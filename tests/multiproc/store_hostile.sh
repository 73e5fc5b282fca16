#!/usr/bin/env bash
# Rank 0's store against strangers (Note [Job store], docs/environment.md):
# a single-node job listens on loopback only; stray connections (silent, or
# announcing 512 MiB) are cut off without costing memory or blocking the job;
# a rank with a wrong or missing LOCKSTEP_STORE_SECRET exits 2 saying so;
# lockstep-run gives each job a fresh secret.
source "$(dirname "$0")/lib.sh"

secret="store-test-$$-abcdefghijklmnop"
p=$(free_port)
rank() {  # rank R SECRET OUT ARGS...: one rank of a 2-rank job on port $p
  local r=$1 s=$2 out=$3
  shift 3
  env RANK="$r" WORLD_SIZE=2 LOCAL_RANK="$r" LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT="$p" \
    OMP_NUM_THREADS=1 ${s:+LOCKSTEP_STORE_SECRET=$s} "$LOCKSTEP" check --comm --rdzv-timeout-s 60 "$@" \
    >"$out" 2>&1
}
rss_kb() { awk '/^VmRSS/ {print $2}' "/proc/$1/status"; }

# Rank 0 alone: it hosts the store and waits for rank 1.
rank 0 "$secret" "$WORK/r0.out" &
r0=$!
listening() { [ -n "$(ss -Hltn "sport = :$1")" ]; }
wait_for 120 "rank 0's store to listen" listening "$p"
ss -Hltn "sport = :$p" >"$WORK/listen"
expect_grep "$WORK/listen" "127\.0\.0\.1:$p" "the store of a one-host job listens on 127.0.0.1"
if grep -qE "(\*|0\.0\.0\.0|\[::\]):$p" "$WORK/listen"; then fail "it also listens on every interface"; else pass "and on no other address"; fi
rss_before=$(rss_kb "$r0")

# Strays: 20 silent connections, one announcing a 512 MiB value as to c10d's
# TCPStore and pushing 64 MiB, one with our magic that stalls in its hello.
$PY - "$p" >"$WORK/strays" 2>&1 <<'PY' &
import socket, struct, sys, time
port = int(sys.argv[1])
def conn():
    s = socket.create_connection(("127.0.0.1", port)); s.settimeout(0.2); return s
def closed(s):
    try:
        return s.recv(1) == b""
    except socket.timeout:
        return False
    except OSError:
        return True
silent = [conn() for _ in range(20)]
loud = conn()
start = time.time()
sent = 0
try:
    loud.sendall(struct.pack("<I", 512 << 20) + b"\x00" * 4)
    chunk = b"z" * (1 << 20)
    for _ in range(64):
        loud.sendall(chunk); sent += len(chunk)
except OSError:
    pass
loud_closed = closed(loud) or sent < (64 << 20)
print("announcer cut off after %.2f s, %d MiB accepted" % (time.time() - start, sent >> 20))
stall = conn(); stall.sendall(b"LKSTORE2" + b"0123")
t = time.time()
while not closed(stall) and time.time() - t < 20: pass
print("stalled hello cut off after %.1f s" % (time.time() - t))
print("silent still open: %d" % sum(not closed(s) for s in silent))
PY
strays=$!
sleep 1
rss_during=$(rss_kb "$r0")
expect_lt "$((rss_during - rss_before))" 20480 "rank 0's memory grew by under 20 MB with the strays connected"

# Rank 1 with a wrong secret, then with none: refused, exit 2, saying why.
start=$(now)
rank 1 "wrong-secret-of-another-job" "$WORK/wrong.out"
expect_eq "$?" 2 "a rank with another job's secret exits 2"
expect_grep "$WORK/wrong.out" "store at 127\.0\.0\.1:$p could not prove it holds this process's LOCKSTEP_STORE_SECRET: the secret differs from rank 0's" "and says the secret differs, naming the store"
rank 1 "" "$WORK/none.out"
expect_eq "$?" 2 "a rank without a secret exits 2"
expect_grep "$WORK/none.out" "requires LOCKSTEP_STORE_SECRET and this process has none" "and says it has none"
expect_lt "$(elapsed "$start")" 10 "both refusals come at once"
rank 1 "tiny-value" "$WORK/short.out"
expect_eq "$?" 2 "a malformed secret exits 2"
expect_grep "$WORK/short.out" "LOCKSTEP_STORE_SECRET must be 16 to 256 printable characters" "naming the variable"
if grep -q "tiny-value" "$WORK/short.out"; then fail "the secret's value was printed"; else pass "without printing the value"; fi

# The right rank 1, while the strays are still connected: the job runs.
rank 1 "$secret" "$WORK/r1.out"
c1=$?
wait "$r0"
c0=$?
expect_eq "$c0:$c1" "0:0" "the job with the right secret runs past the strays"
expect_grep "$WORK/r0.out" "comm check \(shm, 2 ranks\): 55 passed, 0 failed" "and its comm check passes"
wait "$strays"
cat "$WORK/strays"
expect_grep "$WORK/strays" "announcer cut off after [0-4]\.[0-9]+ s, [0-9] MiB accepted" "a 512 MiB announcement is cut off within seconds, after a few MiB"
expect_grep "$WORK/strays" "stalled hello cut off after ([0-9]|1[01])\.[0-9] s" "a stalled hello is cut off (its 10 s limit, or the job ending first)"
expect_grep "$WORK/strays" "silent still open: 0" "silent connections are cut off too"

# A squatter holds the port before rank 0 (Note [Store handshake]): it
# records what a rank sends and answers with lockstep's magic and a made-up
# proof. The rank refuses it at once (exit 2, naming the address), and the
# squatter learns a nonce: not the secret.
sq=$(free_port)
$PY - "$sq" "$WORK/heard" >"$WORK/squatter" 2>&1 <<'PY' &
import os, socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(8); s.settimeout(30)
c, _ = s.accept(); c.settimeout(1)
heard = b""
try:
    while True:
        b = c.recv(4096)
        if not b: break
        heard += b
        if len(heard) >= 40: c.sendall(b"LKSTORE2" + b"\x01" + os.urandom(64))
except (socket.timeout, OSError):
    pass
open(sys.argv[2], "wb").write(heard)
PY
squatter=$!
wait_for 60 "the squatter to listen" listening "$sq"
start=$(now)
env RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT="$sq" \
  OMP_NUM_THREADS=1 LOCKSTEP_STORE_SECRET="$secret" "$LOCKSTEP" check --comm --rdzv-timeout-s 60 \
  >"$WORK/squatted.out" 2>&1
expect_eq "$?" 2 "a rank facing a squatter on MASTER_PORT exits 2"
expect_lt "$(elapsed "$start")" 10 "at once, not after the rendezvous timeout"
expect_grep "$WORK/squatted.out" "store at 127\.0\.0\.1:$sq could not prove it holds this process's LOCKSTEP_STORE_SECRET" "naming the address it refused"
wait "$squatter"
if [ -s "$WORK/heard" ] && ! grep -qF -- "$secret" "$WORK/heard"; then
  pass "the squatter heard $(stat -c %s "$WORK/heard") bytes and not the secret"
else
  fail "the squatter heard the secret (or nothing: $(stat -c %s "$WORK/heard" 2>/dev/null) bytes)"
fi

# The flood of 300 stray sockets: store_flood.sh.

# lockstep-run makes a fresh 64-hex-digit secret per job, given to workers.
"$LOCKSTEP_RUN" --nproc-per-node 2 --master-port 0 sh -c 'echo "S=$LOCKSTEP_STORE_SECRET"' >"$WORK/s1" 2>&1
"$LOCKSTEP_RUN" --nproc-per-node 1 --master-port 0 sh -c 'echo "S=$LOCKSTEP_STORE_SECRET"' >"$WORK/s2" 2>&1
s1=$(sed -n 's/.*S=//p' "$WORK/s1" | sort -u)
s2=$(sed -n 's/.*S=//p' "$WORK/s2" | sort -u)
[[ "$s1" =~ ^[0-9a-f]{64}$ ]] && pass "both workers of a job get one 64-hex-digit secret" || fail "secret '$s1'"
[ "$s1" != "$s2" ] && pass "another job gets another secret" || fail "two jobs share '$s1'"
LOCKSTEP_STORE_SECRET=given-by-the-user-0123456789 "$LOCKSTEP_RUN" --nproc-per-node 1 --master-port 0 \
  sh -c 'echo "S=$LOCKSTEP_STORE_SECRET"' >"$WORK/s3" 2>&1
expect_grep "$WORK/s3" "S=given-by-the-user-0123456789$" "a secret in the environment is passed on"
finish
