#!/usr/bin/env bash
# What a run reads survives its checkpoints (issue "Nothing silently wrong,
# round 5"), each against what a user does:
# 1. a relative --set input path is saved absolute: eval of the checkpoint
#    from another folder reads the same data (before: exit 2);
# 2. data.tokenizer in a config file is relative to the file's folder, and
#    generate works from anywhere (before: only from the file's folder);
# 3. lockstep tokenize --format llmc, then --decode: the text byte for byte
#    (before: the llm.c header was never recognised);
# 4. model.init_from moved away after training: eval and resume still work
#    (the checkpoint holds every weight; before: exit 2);
# 5. run.name with quotes, a backslash, a tab and non-ASCII: eval, export and
#    generate of its checkpoints read config.yaml back (before: malformed
#    YAML, exit 2); invalid UTF-8 is refused at start with exit 2;
# 6. the start-up line without --config names what --set chose (before: "an
#    MLP on the 8x8 digits" while a GPT trained).
source "$(dirname "$0")/lib.sh"
root=$(cd "$(dirname "$0")/../.." && pwd)
python3 "$root/tests/fuzz/make_reader_corpus.py" "$WORK/corpus" || { fail "corpus"; finish; exit 1; }
mkdir -p "$WORK/job" "$WORK/elsewhere" "$WORK/cfg"
cp "$WORK/corpus/vocab/valid_tokenizer.json" "$WORK/cfg/tok.json"
head -c 60000 "$root/data/kjv.txt" >"$WORK/job/small.txt"
tiny=(--set model.name=gpt --set model.n_layer=1 --set model.n_head=2 --set model.n_embd=16
  --set model.block_size=16 --set data.batch_size=4 --set train.max_steps=6 --set checkpoint.every=3
  --set log.every=100 --set data.validation_fraction=0.1)

# 1. A relative --set path, eval from elsewhere.
(cd "$WORK/job" && "$LOCKSTEP" train "${tiny[@]}" --set data.name=text --set data.path=small.txt \
  --set run.dir=runs --set run.name=rel >"$WORK/rel.out" 2>&1)
expect_eq "$?" 0 "training with --set data.path=small.txt (relative)"
expect_grep "$WORK/job/runs/rel/config.yaml" "path: \"$WORK/job/small.txt\"" "config.yaml holds the path made absolute"
(cd "$WORK/elsewhere" && "$LOCKSTEP" eval --checkpoint "$WORK/job/runs/rel" >"$WORK/eval1.out" 2>&1)
expect_eq "$?" 0 "eval of that checkpoint from another folder"

# 2 and 3. Token files in llm.c's format with a tokenizer.json; a config
# naming both relative to its own folder.
"$LOCKSTEP" tokenize "$WORK/job/small.txt" --vocab "$WORK/cfg/tok.json" --format llmc \
  --val-fraction 0.1 --out "$WORK/cfg/tokens" >"$WORK/tok.out" 2>&1
expect_eq "$?" 0 "tokenize --format llmc with a tokenizer.json"
"$LOCKSTEP" tokenize --vocab "$WORK/cfg/tok.json" --decode "$WORK/cfg/tokens/train.bin" >"$WORK/back.txt" 2>"$WORK/decode.err"
expect_eq "$?" 0 "tokenize --decode reads the llm.c file it wrote"
head -c "$(stat -c %s "$WORK/back.txt")" "$WORK/job/small.txt" | cmp -s - "$WORK/back.txt" &&
  [ "$(stat -c %s "$WORK/back.txt")" -gt 50000 ] && pass "the decoded text is the input's first $(stat -c %s "$WORK/back.txt") bytes, byte for byte" ||
  fail "the decoded text differs from the input ($(head -c 200 "$WORK/decode.err"))"
cat >"$WORK/cfg/tokens.yaml" <<EOF
run: {name: tok, dir: $WORK/runs}
data: {name: tokens, path: tokens/train.bin, tokenizer: tok.json, vocab_size: 262}
EOF
(cd "$WORK/elsewhere" && "$LOCKSTEP" train --config ../cfg/tokens.yaml "${tiny[@]}" >"$WORK/tokens.out" 2>&1)
expect_eq "$?" 0 "training on the token files, config given from another folder"
expect_grep "$WORK/runs/tok/config.yaml" "tokenizer: \"$WORK/cfg/tok.json\"" "data.tokenizer resolved against the config's folder"
(cd / && "$LOCKSTEP" generate --checkpoint "$WORK/runs/tok" --prompt "hello" --max-new-tokens 5 >"$WORK/gen.out" 2>&1)
expect_eq "$?" 0 "generate --prompt from / reads the recorded tokenizer"

# --decode reads only what llm.c writes: a header counting fewer tokens than
# the file holds is refused (its tail would go unread); tokenize's empty
# val.bin is no tokens; a full output is an error, not exit 0.
"$PY" - "$WORK/cfg/tokens/train.bin" "$WORK/under.bin" <<'PY'
import struct, sys
data = bytearray(open(sys.argv[1], "rb").read())
count = struct.unpack_from("<i", data, 8)[0]
struct.pack_into("<i", data, 8, count - 5)
open(sys.argv[2], "wb").write(data)
PY
"$LOCKSTEP" tokenize --vocab "$WORK/cfg/tok.json" --decode "$WORK/under.bin" >"$WORK/under.out" 2>&1
expect_eq "$?" 2 "--decode of a header that counts 5 tokens too few: exit 2"
expect_grep "$WORK/under.out" "its tail would go unread" "saying the tail would go unread"
"$LOCKSTEP" tokenize "$WORK/job/small.txt" --vocab "$WORK/cfg/tok.json" --val-fraction 0 --out "$WORK/noval" >/dev/null 2>&1
"$LOCKSTEP" tokenize --vocab "$WORK/cfg/tok.json" --decode "$WORK/noval/val.bin" >"$WORK/empty.out" 2>&1
expect_eq "$?:$(stat -c %s "$WORK/empty.out")" "0:0" "--decode of tokenize's empty val.bin: no text, exit 0"
"$LOCKSTEP" tokenize --vocab "$WORK/cfg/tok.json" --decode "$WORK/cfg/tokens/train.bin" >/dev/full 2>"$WORK/full.err"
expect_eq "$?" 2 "--decode into a full device: exit 2"
expect_grep "$WORK/full.err" "cannot write the decoded text to standard output" "saying so"

# A NUL byte in a config file is refused with its line (yaml-cpp would read
# it as an escape); ".." after a symbolic link is resolved as the kernel
# does; "~/" is the home folder.
printf 'run:\n  name: ok\ndata:\n  path: /tmp/a\000b\n' >"$WORK/nul.yaml"
"$LOCKSTEP" train --config "$WORK/nul.yaml" --print-config >"$WORK/nul.out" 2>&1
expect_eq "$?" 2 "a NUL byte in a config file: exit 2"
expect_grep "$WORK/nul.out" "nul.yaml:4: a NUL byte" "naming the line"
mkdir -p "$WORK/real/sub"
ln -s "$WORK/real/sub" "$WORK/link"
(cd "$WORK" && "$LOCKSTEP" train --print-config --set model.init_from=link/../init.pt) | grep -q "init_from: \"$WORK/real/init.pt\"" &&
  pass "link/../init.pt resolves through the link, as ls would" || fail "link/../ resolved as text"
HOME="$WORK/home" "$LOCKSTEP" train --print-config --set data.path='~/x.csv' | grep -q "path: \"$WORK/home/x.csv\"" &&
  pass "~/x.csv is the home folder's" || fail "~/ was not expanded"

# 4. init_from moved away after training.
"$LOCKSTEP" train --config "$root/configs/digits.yaml" --set run.dir="$WORK/runs" --set run.name=base \
  --set train.max_steps=5 --set checkpoint.every=5 >"$WORK/base.out" 2>&1
cp "$WORK/runs/base/checkpoints/step_00000005/model.pt" "$WORK/init.pt"
"$LOCKSTEP" train --config "$root/configs/digits.yaml" --set run.dir="$WORK/runs" --set run.name=from \
  --set model.init_from="$WORK/init.pt" --set train.max_steps=10 --set checkpoint.every=5 >"$WORK/from.out" 2>&1
expect_eq "$?" 0 "training from model.init_from"
mv "$WORK/init.pt" "$WORK/moved.pt"
"$LOCKSTEP" eval --checkpoint "$WORK/runs/from" >"$WORK/eval2.out" 2>&1
expect_eq "$?" 0 "eval after init_from's file moved away"
"$LOCKSTEP" train --config "$root/configs/digits.yaml" --set run.dir="$WORK/runs" --set run.name=from \
  --set model.init_from="$WORK/init.pt" --set checkpoint.resume=auto --set train.max_steps=15 \
  --set checkpoint.every=5 >"$WORK/resume.out" 2>&1
expect_eq "$?" 0 "resume after init_from's file moved away"
expect_grep "$WORK/resume.out" "resumed from .*step_00000010" "resumed from step 10"
"$LOCKSTEP" train --config "$root/configs/digits.yaml" --set run.dir="$WORK/runs" --set run.name=from2 \
  --set model.init_from="$WORK/init.pt" --set train.max_steps=5 >"$WORK/fresh.out" 2>&1
expect_eq "$?" 2 "a fresh run still needs init_from's file (exit 2 when it is gone)"

# 5. Strings that need escaping in config.yaml.
name=$(printf 'exp "best" \\ tab\there \xc3\xa9')
"$LOCKSTEP" train "${tiny[@]}" --set data.name=text --set data.path="$WORK/job/small.txt" \
  --set run.dir="$WORK/runs" --set run.name="$name" >"$WORK/name.out" 2>&1
expect_eq "$?" 0 "training with run.name '$name'"
"$LOCKSTEP" eval --checkpoint "$WORK/runs/$name" >"$WORK/eval3.out" 2>&1
expect_eq "$?" 0 "eval of its checkpoint reads config.yaml back"
"$LOCKSTEP" export --checkpoint "$WORK/runs/$name" --out "$WORK/export" >"$WORK/export.out" 2>&1
expect_eq "$?" 0 "export of its checkpoint"
"$LOCKSTEP" generate --checkpoint "$WORK/runs/$name" --prompt "In" --max-new-tokens 4 >"$WORK/gen2.out" 2>&1
expect_eq "$?" 0 "generate from its checkpoint"
"$LOCKSTEP" train --print-config --set run.name="$name" --set log.level=debug | grep -q '^  name: "exp \\"best\\" \\\\ tab\\there é"$' &&
  pass "config.yaml's line escapes the quotes, the backslash and the tab" || fail "run.name is written as: $("$LOCKSTEP" train --print-config --set run.name="$name" | grep '^  name:' | head -1)"
"$LOCKSTEP" train "${tiny[@]}" --set run.dir="$WORK/runs" --set run.name="$(printf 'bad\xff')" >"$WORK/bad.out" 2>&1
expect_eq "$?" 2 "a run.name that is no UTF-8 exits 2 at start"
expect_grep "$WORK/bad.out" "run.name.*not UTF-8 text" "naming the key"

# 6. The start-up line names what runs.
"$LOCKSTEP" train "${tiny[@]}" --set data.name=text --set data.path="$WORK/job/small.txt" \
  --set run.dir="$WORK/runs" --set run.name=line --set train.max_steps=1 >"$WORK/line.out" 2>&1
expect_grep "$WORK/line.out" "no --config: training model.name gpt on data.name text \($WORK/job/small.txt\)" "the start-up line names the GPT on text"
grep -q "8x8 digits" "$WORK/line.out" && fail "the start-up line still speaks of the digits" || pass "and not of the digits"
finish
