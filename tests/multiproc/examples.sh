#!/usr/bin/env bash
# lockstep as a library: the package is installed into a temporary prefix
# and every example is configured and built against that prefix alone (no
# file of the build tree), then run on 2 ranks; and `lockstep train` trains
# a TorchScript model from YAML.
#   1. examples/custom_model: own CNN + DDP + sampler + no_sync + per-step
#      fingerprint checks: learns (accuracy > 0.9), ranks end identical;
#   2. examples/custom_model's custom_trainer: a registered model in the
#      whole trainer (train_main);
#   3. examples/torchscript: Python saves, C++ trains on 2 ranks, Python
#      loads the weights and gets the loss C++ printed;
#   4. model.name: torchscript in lockstep train: per-step checks, a
#      checkpoint that loads into the Python module, resume bit-identity, and
#      bad input (missing file, a forward that does not fit the data).
# Usage: examples.sh LOCKSTEP LOCKSTEP_RUN BUILD_DIR
source "$(dirname "$0")/lib.sh"
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${3:?usage: examples.sh LOCKSTEP LOCKSTEP_RUN BUILD_DIR}
prefix="$WORK/prefix"

before=$(git -C "$root" status --porcelain 2>/dev/null | sha256sum)
cmake --install "$build" --prefix "$prefix" >"$WORK/install.log" 2>&1
expect_eq "$?" 0 "cmake --install into a temporary prefix"
expect_eq "$(git -C "$root" status --porcelain 2>/dev/null | sha256sum)" "$before" "installing writes nothing into the source tree"
for f in lib/cmake/lockstep/lockstepConfig.cmake lib/cmake/lockstep/lockstepConfigVersion.cmake \
  include/lockstep/ddp/ddp.h include/lockstep/distributed/init.h bin/lockstep bin/lockstep-run; do
  [ -e "$prefix/$f" ] && pass "installed $f" || fail "not installed: $f"
done
for layer in util distributed data ddp check train; do
  ls "$prefix"/lib*/liblockstep_$layer.a >/dev/null 2>&1 && pass "installed liblockstep_$layer.a" || fail "no liblockstep_$layer.a"
done
run="$prefix/bin/lockstep-run"
# The examples find the LibTorch the build used, as its user would point
# them at it: Torch_DIR and the build's compiler and linker settings (on the
# pip platform: the wheel's torch, its CUDA settings, Debian's fmt first).
cache_value() { sed -n "s/^$1:[A-Z]*=//p" "$build/CMakeCache.txt"; }
platform=()
for key in Torch_DIR Caffe2_DIR CMAKE_CXX_FLAGS CMAKE_EXE_LINKER_FLAGS TORCH_CUDA_ARCH_LIST CMAKE_CUDA_ARCHITECTURES \
  CMAKE_CUDA_COMPILER nvtx3_dir USE_SYSTEM_NVTX CUDNN_INCLUDE_PATH CUDNN_LIBRARY_PATH c10_LIBRARY TORCH_LIBRARY; do
  value=$(cache_value "$key")
  [ -n "$value" ] && platform+=("-D$key=$value")
done

# Both example projects, configured against the prefix only, built in one go.
for ex in custom_model torchscript; do
  cmake -S "$root/examples/$ex" -B "$WORK/$ex" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$prefix" "${platform[@]}" >"$WORK/$ex.configure" 2>&1
  expect_eq "$?" 0 "examples/$ex configures with find_package(lockstep)"
  if grep -q "$root/include" "$WORK/$ex/build.ninja"; then
    fail "examples/$ex reads headers from the source tree"
  else
    pass "examples/$ex uses the installed headers"
  fi
done
(cmake --build "$WORK/custom_model" -j 2 && cmake --build "$WORK/torchscript" -j 2) >"$WORK/build.log" 2>&1
expect_eq "$?" 0 "the examples build against the installed package"
[ -s "$WORK/build.log" ] && grep -E "error" "$WORK/build.log" | head -5

# The build tree is a package as well (export(EXPORT)): the same example
# configured with CMAKE_PREFIX_PATH=<build>, headers from the source tree.
cmake -S "$root/examples/custom_model" -B "$WORK/from_build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$build" "${platform[@]}" >"$WORK/from_build.configure" 2>&1
expect_eq "$?" 0 "examples/custom_model configures with CMAKE_PREFIX_PATH=<build tree>"
expect_grep "$WORK/from_build/CMakeCache.txt" "^lockstep_DIR:PATH=$build\$" "finding the build tree's lockstepConfig.cmake"
cmake --build "$WORK/from_build" --target custom_model -j 2 >"$WORK/from_build.log" 2>&1
expect_eq "$?" 0 "and builds against it"
(cd "$WORK" && "$run" --nproc-per-node 2 --master-port 0 "$WORK/from_build/custom_model") >"$WORK/out" 2>&1
expect_eq "$?" 0 "that build runs on 2 ranks"
from_build=$(sed -n 's/.*rank 0: .*weights \([0-9a-f]*\)$/\1/p' "$WORK/out")

# 1. Own model and loop.
(cd "$WORK" && "$run" --nproc-per-node 2 --master-port 0 "$WORK/custom_model/custom_model") >"$WORK/out" 2>&1
expect_eq "$?" 0 "custom_model on 2 ranks exits 0"
expect_grep "$WORK/out" "rank 0: 24 steps, every one checked; accuracy 0\.9[0-9]+|accuracy 1\.0000" "rank 0 learned (24 checked steps, accuracy >= 0.9)"
w0=$(sed -n 's/.*rank 0: .*weights \([0-9a-f]*\)$/\1/p' "$WORK/out")
w1=$(sed -n 's/.*rank 1: .*weights \([0-9a-f]*\)$/\1/p' "$WORK/out")
[ -n "$w0" ] && expect_eq "$w1" "$w0" "both ranks end with the same weights" || fail "no weights line"
expect_eq "${from_build:-none}" "${w0:-missing}" "the build-tree build ends with the installed build's weights"

# 1b. Fully sharded parameters for your own module (examples/custom_model/sharded.cpp).
(cd "$WORK" && "$run" --nproc-per-node 2 --master-port 0 "$WORK/custom_model/sharded") >"$WORK/out" 2>&1
expect_eq "$?" 0 "sharded (fully_shard + call_unit) on 2 ranks exits 0"
expect_grep "$WORK/out" "rank 1: 20 steps sharded; held [0-9]+ of 17424 weight bytes between steps; largest difference from one process on the whole batch ([0-9.e-]+)" \
  "it matches one process on the whole batch (within 1e-5)"
held=$(sed -n 's/.*rank 0: .*held \([0-9]*\) of.*/\1/p' "$WORK/out")
awk -v h="${held:-0}" 'BEGIN{exit !(h > 0.3 * 17424 && h < 0.7 * 17424)}' &&
  pass "rank 0 holds about half the weights between steps ($held of 17424 bytes)" ||
  fail "rank 0 holds ${held:-?} of 17424 bytes"

# 2. A registered model in the whole trainer.
(cd "$WORK" && "$run" --nproc-per-node 2 --master-port 0 "$WORK/custom_model/custom_trainer" \
  --config "$root/examples/custom_model/tiny.yaml" --set run.dir="$WORK/runs" \
  --set ddp.comm_hook=counting) >"$WORK/out" 2>&1
expect_eq "$?" 0 "custom_trainer (register_model + train_main) exits 0"
expect_grep "$WORK/runs/tiny/config.yaml" 'comm_hook: "counting"' "ddp.comm_hook: counting (registered by name)"
expect_grep "$WORK/out" "\[rank1\]: \[hook\] bucket 1 of 1: 4 gradients, [0-9]+ bytes" "the registered hook exchanges the gradients"
expect_grep "$WORK/out" "trained [0-9]+ steps: validation accuracy 0\.(8|9)[0-9]+" "the registered model trains (accuracy >= 0.8)"
expect_grep "$WORK/runs/tiny/config.yaml" 'name: "tiny"' "under its registered name"
expect_grep "$WORK/runs/tiny/config.yaml" 'loss: "smoothed"' "train.loss: smoothed"
expect_grep "$WORK/out" "\[rank1\]: \[loss\] label-smoothed cross-entropy" "the registered loss is the one trained with"
expect_grep "$WORK/out" "\[rank0\]: \[report\] step [0-9]+: val_loss [0-9.]+ val_accuracy [0-9.]+" "the registered callback runs at each evaluation"
expect_grep "$WORK/out" "\[rank0\]: \[report\] checkpoint .*/runs/tiny/checkpoints/step_[0-9]{8}\$" "and at each checkpoint"
steps=$(sed -n 's/.*trained \([0-9]*\) steps.*/\1/p' "$WORK/out")
expect_grep "$WORK/out" "\[rank0\]: \[report\] $steps steps seen" "and at every step ($steps)"
"$WORK/custom_model/custom_trainer" --config "$root/examples/custom_model/tiny.yaml" \
  --set run.dir="$WORK/runs" --set train.loss=smoothd >"$WORK/out" 2>&1
expect_eq "$?" 2 "an unknown loss exits 2"
expect_grep "$WORK/out" "train.loss: unknown loss 'smoothd' \(valid: auto, cross_entropy, mse, smoothed" "and lists the registered ones"
"$WORK/custom_model/custom_trainer" --config "$root/examples/custom_model/tiny.yaml" \
  --set run.dir="$WORK/runs" --set ddp.comm_hook=countng >"$WORK/out" 2>&1
expect_eq "$?" 2 "an unknown comm hook exits 2"
expect_grep "$WORK/out" "ddp.comm_hook: unknown hook 'countng' \(valid: allreduce, fp16, bf16, powersgd, counting;" "and lists the registered ones"
"$WORK/custom_model/custom_trainer" --config "$root/examples/custom_model/tiny.yaml" \
  --set run.dir="$WORK/runs" --set model.name=tiyn >"$WORK/out" 2>&1
expect_eq "$?" 2 "an unknown model name exits 2"
expect_grep "$WORK/out" "unknown model 'tiyn' \(did you mean 'tiny'\?\)" "and suggests the registered one it nearly names"

# 3. Python -> C++ -> Python.
mkdir -p "$WORK/ts"
$PY "$root/examples/torchscript/model.py" save "$WORK/ts" 2>"$WORK/py.err"
expect_eq "$?" 0 "Python scripts and saves the model"
"$run" --nproc-per-node 2 --master-port 0 "$WORK/torchscript/train_script" "$WORK/ts" >"$WORK/out" 2>&1
expect_eq "$?" 0 "C++ trains the scripted model on 2 ranks"
cpp=$(sed -n 's/.*c++: loss \([0-9.]*\) accuracy \([0-9.]*\).*/\1 \2/p' "$WORK/out")
py=$($PY "$root/examples/torchscript/model.py" eval "$WORK/ts" 2>"$WORK/py.err" | sed -n 's/^python: loss \([0-9.]*\) accuracy \([0-9.]*\)/\1 \2/p')
[ -n "$cpp" ] && [ -n "$py" ] && pass "both sides report (c++: $cpp; python: $py)" || { fail "missing report"; cat "$WORK/py.err"; }
awk -v a="$cpp" -v b="$py" 'BEGIN { split(a, x, " "); split(b, y, " ");
  exit !(x[1] - y[1] < 1e-5 && y[1] - x[1] < 1e-5 && x[2] == y[2] && x[2] > 0.8) }' &&
  pass "Python's loss and accuracy on the loaded weights equal C++'s, accuracy > 0.8" ||
  fail "Python ($py) and C++ ($cpp) disagree, or it did not learn"

# 4. lockstep train with model.name: torchscript.
$PY -c "
import torch
torch.manual_seed(0)
torch.jit.script(torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 32), torch.nn.ReLU(),
                                     torch.nn.Linear(32, 10))).save('$WORK/digits.ts')
torch.jit.script(torch.nn.Linear(10, 3)).save('$WORK/wrong.ts')
" 2>"$WORK/py.err" || fail "could not script the digits model"
LAUNCH=$run  # the installed launcher
TRAIN_ARGS=(--set model.name=torchscript --set model.path="$WORK/digits.ts" --set check.every=1
            --set checkpoint.every=30)
train run 2 --set run.name=ts --set train.max_steps=60 --set optim.decay_steps=60
expect_eq "$?" 0 "lockstep train trains a TorchScript model on 2 ranks"
expect_grep "$WORK/run.out" "trained 60 steps: validation accuracy 0\.[6-9]" "it learns the digits (accuracy >= 0.6 after 60 steps)"
straight=$(weights run)
$PY -c "
import torch
net = torch.jit.load('$WORK/digits.ts')
sd = torch.load('$WORK/runs/ts/checkpoints/step_00000060/model.pt')
net.load_state_dict(sd)  # strict: every key, no extra
assert sorted(sd) == sorted(net.state_dict()), (sorted(sd), sorted(net.state_dict()))
print('keys', ' '.join(sorted(sd)))
" >"$WORK/py.out" 2>&1
expect_eq "$?" 0 "the checkpoint's model.pt loads into the Python module (load_state_dict, strict)"
expect_grep "$WORK/py.out" "keys 1.bias 1.weight 3.bias 3.weight" "under the module's own names"
train run 2 --set run.name=ts2 --set train.max_steps=30 --set optim.decay_steps=60
train run 2 --set run.name=ts2 --set train.max_steps=60 --set checkpoint.resume=auto --set optim.decay_steps=60
expect_grep "$WORK/run.out" "resumed from .*step_00000030 at step 30" "a TorchScript run resumes"
[ -n "$straight" ] && expect_eq "$(weights run)" "$straight" "and ends bit-identical to the straight run"
"$LOCKSTEP" train --config "$root/configs/digits.yaml" --set run.dir="$WORK/runs" \
  --set model.name=torchscript --set model.path="$WORK/missing.ts" >"$WORK/out" 2>&1
expect_eq "$?" 2 "a missing TorchScript file exits 2"
expect_grep "$WORK/out" "model.path '$WORK/missing.ts': cannot be loaded as a TorchScript module" "naming the file"
"$LOCKSTEP" train --config "$root/configs/digits.yaml" --set run.dir="$WORK/runs" \
  --set model.name=torchscript --set model.path="$WORK/wrong.ts" >"$WORK/out" 2>&1
expect_eq "$?" 2 "a TorchScript forward that does not fit the data exits 2"
expect_grep "$WORK/out" "model.path '$WORK/wrong.ts': its forward does not take a batch of shape \[2, 64\]" "saying which shape it was given"
"$LOCKSTEP" train --config "$root/configs/digits.yaml" --set run.dir="$WORK/runs" \
  --set model.name=torchscript >"$WORK/out" 2>&1
expect_eq "$?" 2 "model.name=torchscript without model.path exits 2"
finish
