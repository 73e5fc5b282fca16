#!/usr/bin/env bash
# Bad environments and options: a clear message naming the culprit, exit 2;
# an unreachable master: exit 3 within the timeout, naming host:port.
source "$(dirname "$0")/lib.sh"

RANK=abc WORLD_SIZE=2 "$LOCKSTEP" check --comm 2>"$WORK/err"
expect_eq "$?" 2 "RANK=abc exits 2"
expect_grep "$WORK/err" "RANK='abc' is not an integer" "and names the variable and value"

RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 "$LOCKSTEP" check --comm 2>"$WORK/err"
expect_eq "$?" 2 "missing MASTER_PORT exits 2"
expect_grep "$WORK/err" "MASTER_PORT is not set" "and names MASTER_PORT"

RANK=3 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=1 "$LOCKSTEP" check --comm 2>"$WORK/err"
expect_grep "$WORK/err" "RANK=3 must be smaller than the world size 2" "RANK >= WORLD_SIZE named"

"$LOCKSTEP" check --comm --backend ucc 2>"$WORK/err"
expect_eq "$?" 2 "an unknown backend exits 2"
expect_grep "$WORK/err" "--backend: 'ucc' is not one of auto, gloo, shm, hierarchical, nccl, mpi" "and lists the valid ones"

"$LOCKSTEP" check --comm --device gpu 2>"$WORK/err"
expect_eq "$?" 2 "an unknown --device exits 2"
expect_grep "$WORK/err" "--device: 'gpu' is not one of auto, cpu, cuda" "and lists the valid ones"
"$LOCKSTEP" check --comm --device cuda 2>"$WORK/err"
expect_eq "$?" 2 "--device cuda on a CPU LibTorch exits 2"
expect_grep "$WORK/err" "--device: cuda, but this lockstep was built against a LibTorch without CUDA" "and says why"
"$LOCKSTEP" check --config "$(dirname "$0")/../../configs/digits.yaml" --inject typo 2>"$WORK/err"
expect_eq "$?" 2 "an unknown --inject fault exits 2"
expect_grep "$WORK/err" "--inject: 'typo' is not one of none, lr, init, no-buffer-broadcast" "and lists the faults"

"$LOCKSTEP" check --comm --backend nccl 2>"$WORK/err"
expect_eq "$?" 2 "nccl on a CPU LibTorch, or on a machine without a GPU, exits 2"
expect_grep "$WORK/err" "backend 'nccl' (is not available|needs a CUDA GPU, and this machine shows none)" "and says why"

"$LOCKSTEP" check 2>"$WORK/err"
expect_grep "$WORK/err" "nothing to check: pass --comm" "check with no mode"
"$LOCKSTEP" frobnicate 2>"$WORK/err"
expect_eq "$?" 2 "an unknown command exits 2"
expect_grep "$WORK/err" "unknown command 'frobnicate' \(valid: check, train, bench, eval, export, generate, tokenize, checkpoint\)" \
  "and lists every command"
"$LOCKSTEP" --help >"$WORK/out"
for command in check train bench eval export generate tokenize checkpoint; do
  expect_grep "$WORK/out" "^  $command +[a-z]" "--help lists $command with its summary"
done
# A word no option takes is refused, never ignored: a config file without
# --config would otherwise train the built-in defaults.
"$LOCKSTEP" train "$(dirname "$0")/../../configs/gpt-text.yaml" --set train.max_steps=1 >"$WORK/out" 2>"$WORK/err"
expect_eq "$?" 2 "lockstep train FILE (no --config) exits 2"
expect_grep "$WORK/err" "lockstep train: unexpected argument '.*gpt-text.yaml' \(options are --name value; a configuration is --config FILE" \
  "and names the word"
[ -s "$WORK/out" ] && fail "and trains nothing (stdout: $(head -c 200 "$WORK/out"))" || pass "and trains nothing"
"$LOCKSTEP" eval --checkpoint "$WORK/none" stray 2>"$WORK/err"
expect_eq "$?" 2 "a stray word after eval's options exits 2"
expect_grep "$WORK/err" "lockstep eval: unexpected argument 'stray'" "naming it"
"$LOCKSTEP" bench ddp extra 2>"$WORK/err"
expect_eq "$?" 2 "a second word after bench's positional exits 2"
expect_grep "$WORK/err" "lockstep bench: unexpected argument 'extra' \(options are --name value; --help lists them\)" \
  "naming it, without a --config hint bench has no use for"
LOCKSTEP_LOG_LEVEL=loud "$LOCKSTEP" check --comm 2>"$WORK/err"
expect_grep "$WORK/err" "LOCKSTEP_LOG_LEVEL: unknown log level 'loud'" "bad log level named"

# Nobody listens: the rank must give up within the rendezvous timeout.
port=$(free_port)
start=$(now)
RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "$LOCKSTEP" check --comm \
  --rdzv-timeout-s 3 2>"$WORK/err"
code=$?
expect_eq "$code" 3 "unreachable master exits 3"
expect_lt "$(elapsed "$start")" 13 "within the 3 s timeout plus margin"
expect_grep "$WORK/err" "could not reach the store at 127.0.0.1:$port" "the message names host:port"

# A bad configuration fails before the rendezvous: rank 1 of 2, its master
# never comes, and the error is the configuration's (exit 2) at once, not
# an unreachable store (exit 3) after the rendezvous timeout.
port=$(free_port)
start=$(now)
RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "$LOCKSTEP" train \
  --config "$(dirname "$0")/../../configs/digits.yaml" --set dist.rdzv_timeout_s=20 \
  --set optim.zero=1 --set check.optimizer_state=true 2>"$WORK/err"
expect_eq "$?" 2 "a bad configuration with no peer exits 2"
expect_lt "$(elapsed "$start")" 10 "before the 20 s rendezvous timeout"
expect_grep "$WORK/err" "check.optimizer_state.*optim.zero: 1" "and names the keys"

finish
