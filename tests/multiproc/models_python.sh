#!/usr/bin/env bash
# docs/models.md is exact: each built-in model trained by lockstep, rebuilt
# in PyTorch from the page's own Python blocks (tests/python/rebuild.py),
# loaded from the checkpoint and evaluated on the documented split, gives
# the validation accuracy and loss lockstep printed.
source "$(dirname "$0")/lib.sh"
root=$(cd "$(dirname "$0")/../.." && pwd)

# rebuild NAME KIND 'JSON args' --set ... : train 12 steps, compare.
rebuild() {
  local name=$1 kind=$2 json=$3
  shift 3
  "$LOCKSTEP" train --set run.dir="$WORK/runs" --set run.name="$name" --set train.max_steps=12 \
    --set log.every=1000 --set model.name="$kind" "$@" >"$WORK/out" 2>"$WORK/err"
  expect_eq "$?" 0 "$name trains"
  local line acc loss got
  line=$(grep -o "validation accuracy [0-9.]*, loss [0-9.]*" "$WORK/out")
  acc=$(echo "$line" | sed 's/.*accuracy \([0-9.]*\),.*/\1/')
  loss=$(echo "$line" | sed 's/.*loss \([0-9.]*\)/\1/')
  got=$($PY "$root/tests/python/rebuild.py" "$root/docs/models.md" "$root/data/digits.csv.gz" \
    "$kind" "$WORK/runs/$name/checkpoints/step_00000012/model.pt" "$json" 2>"$WORK/py_err")
  if [ -z "$got" ]; then
    fail "$name: Python could not rebuild it"
    sed 's/^/    /' "$WORK/py_err" | tail -20
    return
  fi
  expect_eq "$(echo "$got" | awk '{printf "%.4f", $1}')" "$acc" "$name: Python's validation accuracy equals lockstep's"
  if awk -v a="$(echo "$got" | awk '{print $2}')" -v b="$loss" 'BEGIN{d=a-b; exit !(d < 2e-5 && d > -2e-5)}'; then
    pass "$name: Python's validation loss equals lockstep's ($loss)"
  else
    fail "$name: Python's validation loss $(echo "$got" | awk '{print $2}') differs from lockstep's $loss"
  fi
}

rebuild mlp mlp '{"hidden": 32, "layers": 2, "dropout": 0.1}' \
  --set model.hidden=32 --set model.dropout=0.1
rebuild mlp-plain mlp '{"hidden": 24, "layers": 3}' --set model.hidden=24 --set model.layers=3
rebuild cnn cnn '{"hidden": 8, "batch_norm": true, "dropout": 0.1}' \
  --set model.hidden=8 --set model.batch_norm=true --set model.dropout=0.1
rebuild resnet resnet '{"depth": 10, "width": 4}' --set model.depth=10 --set model.width=4
rebuild resnet-imagenet resnet '{"depth": 18, "width": 2, "stem": "imagenet"}' \
  --set model.depth=18 --set model.width=2 --set model.stem=imagenet
rebuild transformer transformer '{"hidden": 16, "layers": 1, "heads": 2, "token_size": 8}' \
  --set model.hidden=16 --set model.layers=1 --set model.heads=2 --set model.token_size=8

finish
