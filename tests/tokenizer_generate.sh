#!/usr/bin/env bash
# prepare_data with SentencePiece and generate end to end on the CPU: meta.json and tokenizer.model written,
# a reused tokenizer.model giving the same tokens, a short training run on SentencePiece tokens, generate's
# batch of prompts equal to each prompt alone (greedy), and one error line (exit 1) for a missing,
# damaged or mismatched tokenizer, a prompt longer than the context and bad flag values.
# Usage: tokenizer_generate.sh PATH/TO/train PATH/TO/prepare_data PATH/TO/generate
set -uo pipefail
train=$(realpath "$1") prepare=$(realpath "$2") generate=$(realpath "$3")
export_app=$(dirname "$generate")/export  # built beside generate
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
fail() { echo "FAIL $*"; failures=$((failures + 1)); }

# expect_error NAME "expected text" command...: exit code 1 and exactly one line on stderr, holding the text.
expect_error() {
  local name=$1 expected=$2
  shift 2
  "$@" >"$work/out.txt" 2>"$work/err.txt" </dev/null
  local status=$? lines
  lines=$(wc -l <"$work/err.txt")
  if [ $status -ne 1 ]; then fail "$name: exit code $status"; cat "$work/err.txt"; return; fi
  if [ "$lines" -ne 1 ]; then fail "$name: $lines lines on stderr:"; cat "$work/err.txt"; return; fi
  if ! grep -q -- "$expected" "$work/err.txt"; then fail "$name: expected '$expected' in:"; cat "$work/err.txt"; return; fi
  echo "ok   $name: $(cat "$work/err.txt")"
}

# A small corpus: documents of made-up sentences with some non-ASCII text, separated by "%" lines.
mkdir -p "$work/text"
words=(the cat sat on a mat and dog ran far away today café naïve über 日本 "x=42;")
for i in $(seq 1 400); do
  line=""
  for j in $(seq 1 12); do line+="${words[$(( (i * 7 + j * 13 + i * j) % 17 ))]} "; done
  printf '%s\n%s.\n%%\n' "$line" "Document $i ends"
done >"$work/text/corpus.txt"

# SentencePiece: tokenizer.model and meta.json beside the token files, and the encoding speed.
"$prepare" --input "$work/text" --out "$work/sp" --separator % --tokenizer sentencepiece --vocab 320 \
  >"$work/prepare.log" 2>&1 || { fail "prepare_data --tokenizer sentencepiece:"; cat "$work/prepare.log"; exit 1; }
grep -q "MB/s" "$work/prepare.log" && echo "ok   encoding speed: $(grep 'MB/s' "$work/prepare.log")" ||
  fail "no encoding speed in: $(cat "$work/prepare.log")"
[ -s "$work/sp/tokenizer.model" ] && echo "ok   tokenizer.model written" || fail "no tokenizer.model"
python3 - "$work/sp/meta.json" <<'PY' && echo "ok   meta.json: sentencepiece, 320 ids, end_of_text 2" || fail "meta.json"
import json, sys
meta = json.load(open(sys.argv[1]))
assert (meta["tokenizer"], meta["vocab_size"], meta["end_of_text"]) == ("sentencepiece", 320, 2), meta
assert len(meta["tokenizer_model_fnv1a64"]) == 16, meta
PY

# --tokenizer-model reuses a model: the same token files (--tokenizer sentencepiece implied).
"$prepare" --input "$work/text" --out "$work/reused" --separator % --tokenizer-model "$work/sp/tokenizer.model" \
  >/dev/null 2>&1 || fail "prepare_data --tokenizer-model"
cmp -s "$work/sp/train.bin" "$work/reused/train.bin" && cmp -s "$work/sp/val.bin" "$work/reused/val.bin" &&
  echo "ok   --tokenizer-model: the same tokens" || fail "--tokenizer-model gave other tokens"

# prepare_data's bad flags.
expect_error "vocab out of range" "260..65536" \
  "$prepare" --input "$work/text" --out "$work/x1" --tokenizer sentencepiece --vocab 100
mkdir -p "$work/one_letter"
python3 -c "print('a' * 300000)" >"$work/one_letter/a.txt"
expect_error "vocab above what the text holds" "Please set it to a value <= 267; lower --vocab, or give it more text" \
  "$prepare" --input "$work/one_letter" --out "$work/x0" --tokenizer sentencepiece --vocab 300
mkdir -p "$work/many_letters"
python3 -c "import string; print((string.ascii_letters + string.digits + ' ') * 5000)" >"$work/many_letters/a.txt"
expect_error "vocab below the text's characters" "--vocab 270 is too small for this text: its characters and the special pieces need [0-9]* ids; pass --vocab" \
  "$prepare" --input "$work/many_letters" --out "$work/x4" --tokenizer sentencepiece --vocab 270
expect_error "vocab with the byte tokenizer" "--vocab and --tokenizer-model are for --tokenizer sentencepiece" \
  "$prepare" --input "$work/text" --out "$work/x2" --tokenizer bytes --vocab 300
# --vocab alone means SentencePiece, as --tokenizer-model alone does.
"$prepare" --input "$work/text" --out "$work/vocab_alone" --separator % --vocab 320 >/dev/null &&
  [ -s "$work/vocab_alone/tokenizer.model" ] && echo "ok   --vocab alone trains a SentencePiece model" ||
  fail "--vocab alone did not train a SentencePiece model"
expect_error "sentencepiece without vocab" "needs --vocab N" \
  "$prepare" --input "$work/text" --out "$work/x3" --tokenizer sentencepiece
expect_error "unknown tokenizer" "unknown tokenizer 'words'" \
  "$prepare" --input "$work/text" --out "$work/x4" --tokenizer words
printf 'not a model' >"$work/bad.model"
expect_error "malformed --tokenizer-model" "$work/bad.model' is not a valid SentencePiece model" \
  "$prepare" --input "$work/text" --out "$work/x5" --tokenizer-model "$work/bad.model"
expect_error "dataset in the way" "already holds a dataset" \
  "$prepare" --input "$work/text" --out "$work/sp" --tokenizer sentencepiece --vocab 320

# A short run on the SentencePiece tokens, and one on bytes.
"$train" --preset tiny --data "$work/sp" --out "$work/run" --steps 30 --batch 8 --ctx 48 --eval-batches 1 \
  --sample-tokens 0 --log-every 100 --device cpu >"$work/train.log" 2>&1 || { fail "train:"; tail -3 "$work/train.log"; exit 1; }
ckpt="$work/run/checkpoints/step_30.h5"
"$prepare" --input "$work/text" --out "$work/bytes" --separator % >/dev/null 2>&1 || fail "prepare_data bytes"
"$train" --preset tiny --data "$work/bytes" --out "$work/run_bytes" --steps 2 --batch 2 --ctx 32 --eval-batches 1 \
  --sample-tokens 0 --log-every 100 --device cpu >/dev/null 2>&1 || fail "train on bytes"
bytes_ckpt="$work/run_bytes/checkpoints/step_2.h5"
# Byte tokens need no data folder: generate works after the folder moved (the checkpoint records them).
mv "$work/bytes" "$work/bytes_moved"
"$generate" --checkpoint "$bytes_ckpt" --prompt x --max-tokens 3 --temperature 0 >/dev/null 2>"$work/err.txt" &&
  echo "ok   byte-level data folder moved" || { fail "byte-level data folder moved:"; cat "$work/err.txt"; }
mv "$work/bytes_moved" "$work/bytes"
# A checkpoint of one tokenizer on data of another is refused, not trained on ids that mean other things.
expect_error "resume on another tokenizer's data" "it was trained on data of another tokenizer" \
  "$train" --preset tiny --data "$work/bytes" --out "$work/run_mixed" --steps 31 --batch 8 --ctx 48 \
  --eval-batches 1 --device cpu --resume "$ckpt"
# Fewer data ids than the model's: reading them as the model's (--vocab) is offered.
grep -q -- "or --vocab [0-9]* if these ids are meant for that model" "$work/err.txt" ||
  fail "resume on another tokenizer's smaller data: --vocab not offered"
expect_error "start from another tokenizer's model" "it was trained on data of another tokenizer" \
  "$train" --preset tiny --data "$work/sp" --out "$work/run_mixed" --steps 3 --batch 2 --ctx 32 \
  --eval-batches 1 --device cpu --init-from "$bytes_ckpt"
# More data ids than the model's: --vocab could not hold them, so it is not offered.
grep -q -- "--vocab" "$work/err.txt" && fail "start from a smaller model: --vocab offered, which cannot fit the data"

# Relative --data and --out, as train records them, are found from another working folder.
(cd "$work" && "$train" --preset tiny --data sp --out runs/rel --steps 1 --batch 2 --ctx 32 --eval-batches 1 \
  --sample-tokens 0 --device cpu >/dev/null 2>&1) || fail "train with relative paths"
(cd / && "$generate" --checkpoint "$work/runs/rel/checkpoints/step_1.h5" --prompt the --max-tokens 5 >/dev/null) &&
  echo "ok   a relative --data found from another folder" || fail "relative --data not found from /"

# Greedy: a batch of prompts prints what each prompt prints alone, in order.
greedy=(--checkpoint "$ckpt" --temperature 0 --max-tokens 40 --device cpu)
prompts=("the cat" "Document 12" "café über the dog ran far away and" "x")
printf '%s\n' "${prompts[@]}" | "$generate" "${greedy[@]}" >"$work/batch.txt" 2>"$work/batch.err" ||
  fail "generate (batch): $(cat "$work/batch.err")"
: >"$work/alone.txt"
for i in "${!prompts[@]}"; do
  "$generate" "${greedy[@]}" --prompt "${prompts[$i]}" >"$work/alone_$i.txt" 2>/dev/null || fail "generate '${prompts[$i]}'"
  cat "$work/alone_$i.txt" >>"$work/alone.txt"
done
if cmp -s "$work/batch.txt" "$work/alone.txt" && [ -s "$work/batch.txt" ]; then
  echo "ok   batch of ${#prompts[@]} prompts == each alone: $(head -c 60 "$work/batch.txt" | tr '\n' ' ')..."
else
  fail "batch differs from single prompts:"; diff "$work/batch.txt" "$work/alone.txt" | head -10
fi
grep -q "tokens/s" "$work/batch.err" && echo "ok   speed: $(cat "$work/batch.err")" || fail "no tokens/s in: $(cat "$work/batch.err")"
# --jsonl: one object per prompt, in order, each the prompt and its continuation as printed alone.
printf '%s\n' "${prompts[@]}" | "$generate" "${greedy[@]}" --jsonl 2>/dev/null >"$work/batch.jsonl" &&
  python3 - "$work/batch.jsonl" "$work" "${prompts[@]}" <<'PY' && echo "ok   --jsonl: a line per prompt" || fail "--jsonl"
import json, sys
path, work, prompts = sys.argv[1], sys.argv[2], sys.argv[3:]
lines = [json.loads(line) for line in open(path, encoding="utf-8")]
assert [l["prompt"] for l in lines] == prompts, lines
for i, l in enumerate(lines):
    alone = open(f"{work}/alone_{i}.txt", encoding="utf-8", errors="replace").read()
    assert l["prompt"] + l["completion"] + "\n" == alone, (l, alone)
PY
# --batch 2 splits the prompts into batches: the same text.
printf '%s\n' "${prompts[@]}" | "$generate" "${greedy[@]}" --batch 2 2>/dev/null | cmp -s - "$work/alone.txt" &&
  echo "ok   --batch 2: the same text" || fail "--batch 2 changed the text"
# Prompts down a pipe are answered --batch at a time: with --batch 1 the first is answered while the pipe is
# still open.
mkfifo "$work/prompts_in"
"$generate" "${greedy[@]}" --batch 1 <"$work/prompts_in" >"$work/piped.txt" 2>/dev/null &
gen=$!
exec 3>"$work/prompts_in"
echo "the dog" >&3
for _ in $(seq 1 600); do [ -s "$work/piped.txt" ] && break; sleep 0.2; done  # up to 2 min on a busy machine
early=$([ -s "$work/piped.txt" ] && echo yes || echo no)
echo "the cat" >&3
exec 3>&-
wait $gen
[ "$early" = yes ] && grep -q "^the dog" "$work/piped.txt" && grep -q "the cat" "$work/piped.txt" &&
  echo "ok   --batch 1 answers a prompt while the pipe is open" ||
  fail "--batch 1 did not answer the first prompt before the pipe closed (answered: $early)"
# A reader that stops early (| head) ends generate quietly, as SIGPIPE ends other writers (status 141).
for i in $(seq 1 40); do echo "the prompt number $i"; done |
  "$generate" "${greedy[@]}" --batch 1 2>"$work/head.err" | head -c 10 >/dev/null
status=${PIPESTATUS[1]}
[ "$status" -eq 141 ] && ! grep -q error "$work/head.err" &&
  echo "ok   generate | head: status 141, no error" ||
  { fail "generate | head: status $status:"; cat "$work/head.err"; }
# Sampling is repeatable with a seed; bf16 runs; a bytes checkpoint takes its tokenizer from its data too.
sampled=(--checkpoint "$ckpt" --prompt "the dog" --max-tokens 30 --temperature 1.2 --top-k 50 --top-p 0.9 --seed 7)
a=$("$generate" "${sampled[@]}" 2>/dev/null) && b=$("$generate" "${sampled[@]}" 2>/dev/null) && [ "$a" = "$b" ] &&
  echo "ok   sampling repeats with --seed" || fail "sampling with --seed differs"
# A prompt's draws follow the prompt, not its row in a batch: --batch 1 and 3 give the same samples.
sampled_all=(--checkpoint "$ckpt" --max-tokens 20 --temperature 1.2 --seed 7)
a=$(printf '%s\n' "${prompts[@]}" | "$generate" "${sampled_all[@]}" --batch 1 2>/dev/null) &&
  b=$(printf '%s\n' "${prompts[@]}" | "$generate" "${sampled_all[@]}" --batch 3 2>/dev/null) && [ "$a" = "$b" ] &&
  echo "ok   sampled text independent of --batch" || fail "sampled text depends on --batch"
"$generate" --checkpoint "$ckpt" --prompt "the" --max-tokens 10 --precision bf16 >/dev/null 2>&1 &&
  echo "ok   bf16" || fail "--precision bf16"
"$generate" --checkpoint "$bytes_ckpt" --prompt "Line" --max-tokens 10 >/dev/null 2>&1 &&
  echo "ok   bytes checkpoint" || fail "bytes checkpoint"

# --help fits in 100 columns.
for app in "$generate" "$prepare"; do
  "$app" --help >"$work/help.txt" && [ "$(awk '{ if (length($0) > m) m = length($0) } END { print m }' "$work/help.txt")" -le 100 ] &&
    echo "ok   $(basename "$app") --help within 100 columns" || fail "$(basename "$app") --help wider than 100 columns or failing"
done

# One error line each.
long=$(printf 'the cat sat %.0s' $(seq 1 40))
expect_error "prompt longer than the context" "longer than the model's context of 48" \
  "$generate" --checkpoint "$ckpt" --prompt "$long"
expect_error "negative temperature" "--temperature must be a finite number >= 0" \
  "$generate" --checkpoint "$ckpt" --temperature -1 --prompt x
expect_error "top-p 0" "--top-p must be in (0, 1]" "$generate" --checkpoint "$ckpt" --top-p 0 --prompt x
expect_error "negative top-k" "--top-k must not be negative" "$generate" --checkpoint "$ckpt" --top-k -2 --prompt x
expect_error "negative max-tokens" "--max-tokens must not be negative" \
  "$generate" --checkpoint "$ckpt" --max-tokens -1 --prompt x
expect_error "batch 0" "--batch must be at least 1" "$generate" --checkpoint "$ckpt" --batch 0 --prompt x
expect_error "negative seed" "--seed must be >= 0" "$generate" --checkpoint "$ckpt" --seed -1 --prompt x
expect_error "bad precision" "unknown precision 'f16'" "$generate" --checkpoint "$ckpt" --precision f16 --prompt x
expect_error "bad graph value" "--cuda-graph takes auto, on or off, got 'maybe'" \
  "$generate" --checkpoint "$ckpt" --cuda-graph maybe --prompt x
expect_error "bad number" "--temperature expects a number" \
  "$generate" --checkpoint "$ckpt" --temperature warm --prompt x
expect_error "bad device" "tpu" "$generate" --checkpoint "$ckpt" --device tpu --prompt x
# A run folder stands for its newest checkpoint: a damaged one is an error, not a quiet step back to an
# older (here the untrained step_0.h5).
cp -r "$work/run" "$work/run_damaged"
newest=$(ls "$work/run_damaged/checkpoints" | sort -t_ -k2 -n | tail -1)
[ "$newest" = step_30.h5 ] && [ -f "$work/run_damaged/checkpoints/step_0.h5" ] || fail "run folder holds $newest"
truncate -s 4000 "$work/run_damaged/checkpoints/$newest"
expect_error "damaged newest checkpoint (generate)" "to use an older checkpoint, name its file" \
  "$generate" --checkpoint "$work/run_damaged" --prompt x
expect_error "damaged newest checkpoint (export)" "to use an older checkpoint, name its file" \
  "$export_app" --checkpoint "$work/run_damaged" --out "$work/hf_damaged"
[ ! -e "$work/hf_damaged" ] || fail "export of a damaged run folder wrote $work/hf_damaged"
expect_error "no checkpoint" "--checkpoint is required" "$generate" --prompt x
expect_error "missing checkpoint" "$work/none.h5" "$generate" --checkpoint "$work/none.h5" --prompt x
expect_error "no prompts" "no prompts" "$generate" --checkpoint "$ckpt"
# A run folder names its newest checkpoint; text that cannot be written is an error, not a success.
"$generate" --checkpoint "$work/runs/rel" --prompt the --max-tokens 5 --device cpu >/dev/null 2>&1 &&
  echo "ok   a run folder as --checkpoint" || fail "a run folder as --checkpoint"
expect_error "stdout on a full disk" "cannot write the text to standard output" \
  bash -c '"$0" --checkpoint "$1" --prompt the --max-tokens 5 --device cpu >/dev/full' "$generate" "$ckpt"

# Text that is not UTF-8 (Latin-1) loses its bytes to U+FFFD in SentencePiece: prepare_data counts them.
mkdir -p "$work/latin1"
for i in $(seq 1 200); do printf 'caf\xe9 %s and more words\n%%\n' "$i"; done >"$work/latin1/a.txt"
cp "$work/text/corpus.txt" "$work/latin1/"
output=$("$prepare" --input "$work/latin1" --out "$work/latin1_data" --separator % --tokenizer sentencepiece \
  --vocab 340 2>&1)
grep -q "note: 200 bytes of the text are not UTF-8 (in $work/latin1/a.txt)" <<<"$output" &&
  echo "ok   non-UTF-8 bytes counted, their file named" ||
  fail "non-UTF-8 text: $(tail -2 <<<"$output")"
"$prepare" --input "$work/text" --out "$work/utf8_data" --separator % --tokenizer sentencepiece --vocab 320 2>&1 |
  grep -q "not UTF-8" && fail "a UTF-8 corpus (café, 日本) was said not to be"

# Tokenizers that do not fit the checkpoint.
expect_error "bytes tokenizer for a SentencePiece checkpoint" "not the tokenizer the checkpoint was trained with" \
  "$generate" --checkpoint "$ckpt" --tokenizer bytes --prompt x
mkdir -p "$work/text2"
{ cat "$work/text/corpus.txt"; printf 'some other text entirely\n%%\n'; } >"$work/text2/corpus.txt"
"$prepare" --input "$work/text2" --out "$work/other" --separator % --tokenizer sentencepiece --vocab 320 \
  >/dev/null 2>&1 || fail "prepare_data on other text"
expect_error "another tokenizer.model of the same size" "another model file" \
  "$generate" --checkpoint "$ckpt" --tokenizer "$work/other/tokenizer.model" --prompt x
# The same number of pieces is not the same tokenizer: training and evaluating on that data are refused too.
expect_error "resume on data of another tokenizer of the same size" "was trained on tokens of sentencepiece" \
  "$train" --preset tiny --data "$work/other" --out "$work/run_other" --steps 31 --batch 8 --ctx 48 \
  --eval-batches 1 --device cpu --resume "$ckpt"
expect_error "evaluate on data of another tokenizer of the same size" "was trained on tokens of sentencepiece" \
  "$train" --eval-only --resume "$ckpt" --data "$work/other" --batch 2 --eval-batches 1 --device cpu
expect_error "malformed --tokenizer" "is not a valid SentencePiece model" \
  "$generate" --checkpoint "$ckpt" --tokenizer "$work/bad.model" --prompt x
cp "$work/sp/tokenizer.model" "$work/good.model"
head -c 2000 "$work/good.model" >"$work/sp/tokenizer.model"
expect_error "truncated tokenizer.model in the data" "$work/sp/tokenizer.model" \
  "$generate" --checkpoint "$ckpt" --prompt x
rm "$work/sp/tokenizer.model"
expect_error "missing tokenizer.model" "tokenizer.model is missing" "$generate" --checkpoint "$ckpt" --prompt x
cp "$work/good.model" "$work/sp/tokenizer.model"
mv "$work/sp" "$work/moved"
expect_error "data folder gone" "does not exist (moved?); pass --tokenizer FILE.model" \
  "$generate" --checkpoint "$ckpt" --prompt x
# With the data gone, its tokenizer.model still works (the same text); bytes has the wrong vocabulary.
"$generate" "${greedy[@]}" --tokenizer "$work/moved/tokenizer.model" --prompt "${prompts[0]}" 2>/dev/null |
  cmp -s - "$work/alone_0.txt" && echo "ok   --tokenizer FILE without the data folder" ||
  fail "--tokenizer FILE without the data folder"
expect_error "bytes for a 320-id checkpoint" "not the tokenizer the checkpoint was trained with (sentencepiece 320" \
  "$generate" --checkpoint "$ckpt" --tokenizer bytes --prompt x
# The data folder prepared again with another tokenizer: refused, not decoded with the wrong one.
"$prepare" --input "$work/text" --out "$work/sp" --separator % >/dev/null 2>&1 || fail "prepare_data (bytes)"
expect_error "data prepared again" "holds tokens of bytes 257, but $ckpt was trained on tokens of sentencepiece 320" \
  "$generate" --checkpoint "$ckpt" --prompt x
"$generate" "${greedy[@]}" --tokenizer "$work/moved/tokenizer.model" --prompt "${prompts[0]}" 2>/dev/null |
  cmp -s - "$work/alone_0.txt" && echo "ok   --tokenizer FILE when the data was prepared again" ||
  fail "--tokenizer FILE when the data was prepared again"

if [ $failures -gt 0 ]; then
  echo "$failures failure(s)"
  exit 1
fi
echo "all tokenizer and generate checks passed"
