#!/usr/bin/env bash
# dist.backend: mpi (c10d's ProcessGroupMPI) under Open MPI's mpirun.
# With a LibTorch built with MPI (Debian 13's; CMake says "MPI backend: ON"):
#   1. lockstep check --comm passes on 2 and on 4 ranks (55 closed-form cases
#      each, every rank agreeing on the verdict);
#   2. a DDP training run on 2 ranks ends with the same weights, bit for bit,
#      as the same run on Gloo under lockstep-run (a two-term sum is exact in
#      any order, so the backends must agree to the last bit).
# Without it (Debian 12's 1.13): selecting mpi is a clear error, exit 2.
# Usage: mpi.sh LOCKSTEP LOCKSTEP_RUN WITH_MPI(ON|OFF)
source "$(dirname "$0")/lib.sh"
root=$(cd "$(dirname "$0")/../.." && pwd)
with_mpi=${3:-OFF}

if [ "$with_mpi" != ON ]; then
  "$LOCKSTEP" check --comm --backend mpi >"$WORK/out" 2>&1
  expect_eq "$?" 2 "--backend mpi without an MPI LibTorch exits 2 (bad input)"
  expect_grep "$WORK/out" "backend 'mpi' is not available: this lockstep was built against LibTorch .* which has no c10d::ProcessGroupMPI" \
    "the error names what is missing"
  "$LOCKSTEP" train --config "$root/configs/digits.yaml" --set dist.backend=mpi --set run.dir="$WORK/runs" >"$WORK/out" 2>&1
  expect_eq "$?" 2 "dist.backend: mpi in a config exits 2 there too"
  finish
  exit
fi

command -v mpirun >/dev/null || { fail "mpirun not found (scripts/setup.sh installs openmpi-bin on Debian 13)"; finish; exit 1; }
# CI runs as root; Open MPI refuses that unless told. Ranks may outnumber
# cores (Open MPI 5's spelling of --oversubscribe).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpi() {  # mpi NP ARGS...: lockstep under mpirun; rendezvous store for lockstep's own keys
  local np=$1
  shift
  timeout 240 mpirun -np "$np" --map-by :OVERSUBSCRIBE -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT="$(free_port)" -x OMP_NUM_THREADS=1 \
    "$LOCKSTEP" "$@"
}

for np in 2 4; do
  mpi "$np" check --comm --backend mpi --sizes 1,1001,262144 >"$WORK/out" 2>&1
  expect_eq "$?" 0 "mpirun -np $np lockstep check --comm --backend mpi exits 0"
  expect_grep "$WORK/out" "comm check \(mpi, $np ranks\): 55 passed, 0 failed" "all 55 cases pass on $np ranks"
done

common=(train --config "$root/configs/digits.yaml" --set run.dir="$WORK/runs" --set train.max_steps=40
        --set checkpoint.every=0 --set log.every=20)
mpi 2 "${common[@]}" --set run.name=mpi --set dist.backend=mpi >"$WORK/mpi.out" 2>&1
expect_eq "$?" 0 "a 40-step DDP run under mpirun on the mpi backend exits 0"
expect_grep "$WORK/mpi.out" "trained 40 steps" "it trained 40 steps"
expect_grep "$WORK/runs/mpi/config.yaml" '^  backend: "mpi"$' "on the mpi backend (resolved config)"
expect_grep "$WORK/mpi.out" "from openmpi" "with the world read from Open MPI's variables"
"$LOCKSTEP_RUN" --nproc-per-node 2 --master-port 0 "$LOCKSTEP" "${common[@]}" --set run.name=gloo \
  --set dist.backend=gloo >"$WORK/gloo.out" 2>&1
expect_eq "$?" 0 "the same run on Gloo exits 0"
w_mpi=$(weights mpi)
w_gloo=$(weights gloo)
[ -n "$w_mpi" ] && pass "the mpi run printed its weights digest ($w_mpi)" || fail "no weights digest in the mpi run"
expect_eq "$w_mpi" "$w_gloo" "mpi and gloo end with bit-identical weights"

# A launcher that is not mpirun: a clear error, not a hang.
"$LOCKSTEP_RUN" --nproc-per-node 2 --master-port 0 "$LOCKSTEP" check --comm --backend mpi >"$WORK/out" 2>&1
expect_eq "$?" 2 "--backend mpi under lockstep-run exits 2"
expect_grep "$WORK/out" "backend 'mpi' needs ranks started by mpirun" "and says mpirun is needed"
finish
