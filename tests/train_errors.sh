#!/usr/bin/env bash
# Bad input to `train`: each case must print one clear error line, exit non-zero, and leave what was already
# saved intact. Usage: train_errors.sh PATH/TO/train PATH/TO/prepare_data
set -uo pipefail
train=$1 prepare=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0

# expect_error NAME "expected text" command...
expect_error() {
  local name=$1 expected=$2
  shift 2
  local output status
  output=$("$@" 2>&1)
  status=$?
  if [ $status -eq 0 ]; then
    echo "FAIL $name: exit code 0"; failures=$((failures + 1)); return
  fi
  if ! grep -q -- "$expected" <<<"$output"; then
    echo "FAIL $name: expected '$expected' in:"; echo "$output" | tail -3; failures=$((failures + 1)); return
  fi
  echo "ok   $name: $(grep -m1 'error' <<<"$output")"
}

expect_ok() {
  local name=$1
  shift
  if "$@" >"$work/last.log" 2>&1; then echo "ok   $name"; else
    echo "FAIL $name:"; tail -3 "$work/last.log"; failures=$((failures + 1))
  fi
}

# A small real corpus.
mkdir -p "$work/text"
for i in $(seq 1 300); do echo "Line $i of a small corpus: the quick brown fox jumps over the lazy dog."; echo "%"; done >"$work/text/a.txt"
"$prepare" --input "$work/text" --out "$work/data" --separator % >/dev/null || { echo "FAIL prepare_data"; exit 1; }
common=(--data "$work/data" --ctx 16 --batch 2 --eval-batches 1 --sample-tokens 0 --log-every 100)

expect_error "unknown flag" "unknown flag --colour" "$train" --colour blue
expect_error "bad number" "expects an integer" "$train" "${common[@]}" --steps many
expect_error "missing data" "does not exist" "$train" --data "$work/nowhere" --steps 1
mkdir -p "$work/empty" && : >"$work/empty/train.bin" && : >"$work/empty/val.bin"
expect_error "empty token file" "is empty" "$train" --data "$work/empty" --vocab 257 --steps 1
expect_error "token id >= vocab" "not below the vocabulary size 50" "$train" "${common[@]}" --vocab 50 --steps 1
expect_error "context longer than data" "context length 100000 needs at least" "$train" "${common[@]}" --ctx 100000 --steps 1

# A good run to resume from.
expect_ok "train 4 steps" "$train" "${common[@]}" --out "$work/run" --steps 4 --ckpt-every 2
ckpt="$work/run/checkpoints/step_4.h5"
# --zero in one process trains, and the banner says it shards nothing; the step's batch is in the banner.
expect_error "a DDP strategy with ZeRO-2" "reduce-scatters them itself (drop --ddp)" "$train" "${common[@]}" \
  --out "$work/zero2ddp" --steps 1 --zero 2 --ddp overlap
expect_ok "ZeRO-2 with the default --ddp spelled out" "$train" "${common[@]}" --out "$work/zero2default" --steps 1 \
  --zero 2 --ddp bucketed --ckpt-every -1
expect_ok "ZeRO-2 in one process" "$train" "${common[@]}" --out "$work/zero1proc" --steps 1 --zero 2 --grad-accum 2
grep -q "note: --zero 2 in one process shards nothing" "$work/last.log" &&
  grep -q "batch: 4 sequences of 16 tokens per step (2 micro-batches of 2)" "$work/last.log" ||
  { echo "FAIL ZeRO-2 in one process: banner"; head -5 "$work/last.log"; failures=$((failures + 1)); }
# Resumed with another global batch (--batch 4 against 2): a note says the losses will not match.
expect_ok "resume with another batch" "$train" "${common[@]}" --out "$work/rebatched" --steps 5 --cosine-steps 4 \
  --batch 4 --resume "$ckpt"
grep -q "note: the step's global batch is 4 sequences, against 2 in the run that wrote the checkpoint (1 rank x" \
  "$work/last.log" || { echo "FAIL resume with another batch: no note"; tail -3 "$work/last.log"; failures=$((failures + 1)); }
# --grad-dtype f32 is what the f32 run's auto resolved to: no note; bf16 training changes both settings.
expect_ok "resume with --grad-dtype spelled out" "$train" "${common[@]}" --out "$work/regrad" --steps 5 --grad-dtype f32 \
  --resume "$ckpt"
grep -q -- "--grad-dtype" "$work/last.log" &&
  { echo "FAIL resume with --grad-dtype f32: a note"; grep -- "--grad-dtype" "$work/last.log"; failures=$((failures + 1)); }
expect_ok "resume in bf16" "$train" "${common[@]}" --out "$work/rebf16" --steps 5 --precision bf16 --resume "$ckpt"
grep -q -- "note: --precision f32 -> bf16, --grad-dtype auto (f32) -> auto (bf16) differ" "$work/last.log" ||
  { echo "FAIL resume in bf16: no note"; grep note "$work/last.log"; failures=$((failures + 1)); }
expect_error "another run's checkpoints in --out" "already holds checkpoints of another run" \
  "$train" "${common[@]}" --out "$work/run" --steps 2
[ -e "$ckpt" ] || { echo "FAIL: the refused run removed $ckpt"; failures=$((failures + 1)); }
# A run that logged steps past its start point but died before its next checkpoint (out of memory in step 2).
expect_ok "a run of 2 steps" "$train" "${common[@]}" --out "$work/startonly" --steps 2 --ckpt-every 0
rm "$work/startonly/checkpoints/step_2.h5"
expect_error "only a start point, with metrics" "holds only the start point (step 0) of another run, whose" \
  "$train" "${common[@]}" --out "$work/startonly" --steps 2
sum_before=$(md5sum "$ckpt" | cut -d' ' -f1)
expect_error "checkpoint of another shape" "--d-model 32 (the preset's or given) differs from the checkpoint $ckpt (64)" \
  "$train" "${common[@]}" --d-model 32 --out "$work/other" --steps 6 --resume "$ckpt"
expect_error "missing checkpoint" "does not exist" "$train" "${common[@]}" --out "$work/run" --steps 6 --resume "$work/none.h5"
expect_error "NaN loss" "is [A-Za-z]* at step [0-9]*; stopped before the update.*(last good checkpoint: $ckpt)" \
  "$train" "${common[@]}" --out "$work/run" --steps 8 --resume "$ckpt" --lr-max 1e30 --warmup 0 --clip 0
# A full disk (simulated with a file-size limit) while writing the next checkpoint.
expect_error "disk full" "cannot write checkpoint" bash -c "ulimit -f 200; exec \"$train\" ${common[*]} --out $work/run --steps 6 --ckpt-every 2 --resume $ckpt"
[ -e "$work/run/checkpoints/step_6.h5" ] && { echo "FAIL disk full: a partial step_6.h5 exists"; failures=$((failures + 1)); }
ls "$work/run/checkpoints/"*.tmp >/dev/null 2>&1 && { echo "FAIL disk full: a temporary file was left"; failures=$((failures + 1)); }
[ "$(md5sum "$ckpt" | cut -d' ' -f1)" = "$sum_before" ] || { echo "FAIL: step_4.h5 changed"; failures=$((failures + 1)); }
expect_ok "last good checkpoint still loads" "$train" --eval-only --resume "$ckpt" --data "$work/data" --ctx 16 --batch 2 --eval-batches 2

# bf16 gradient buffers: only for bf16 training, not with a second bf16 rounding; they train, with ZeRO-1 too.
expect_error "bf16 gradients in f32" "--grad-dtype bf16 needs --precision bf16" "$train" "${common[@]}" --grad-dtype bf16 --steps 1
expect_ok "bf16 gradients with ZeRO-1" "$train" "${common[@]}" --precision bf16 --grad-dtype bf16 --zero 1 --steps 2 --out "$work/bf16zero"
expect_error "bad gradient dtype" "--grad-dtype takes auto, f32 or bf16, got 'f16'" "$train" "${common[@]}" --grad-dtype f16 --steps 1
expect_error "bad recompute" "--recompute takes none, selective or block, got 'blocks'" "$train" "${common[@]}" --recompute blocks --steps 1
expect_ok "recompute block trains" "$train" "${common[@]}" --recompute block --steps 2 --out "$work/recompute"
expect_ok "recompute selective trains" "$train" "${common[@]}" --recompute selective --recompute-blocks 1 --steps 2 \
  --out "$work/recompute_selective"
expect_ok "bf16 gradients train" "$train" "${common[@]}" --precision bf16 --grad-dtype bf16 --steps 3 --out "$work/bf16grads"
grep -q '"loss"' "$work/bf16grads/metrics.jsonl" || { echo "FAIL: no metrics from the bf16-gradient run"; failures=$((failures + 1)); }

# A single text file without separators still gets a validation split; config values may contain spaces.
printf 'Once there was a tiny model.\nIt read the same lines again and again.\n%.0s' $(seq 1 200) >"$work/one.txt"
expect_ok "prepare_data on one file" "$prepare" --input "$work/one.txt" --out "$work/one"
# Quotes around a value are taken off; '#' starts a comment only at a line's start or after a space.
printf 'steps = 2  # two\nprompt = "A C# #1 tale"\nsample-tokens = 5\n' >"$work/run.cfg"
expect_ok "config file" "$train" --config "$work/run.cfg" --data "$work/one" --ctx 16 --batch 2 --eval-batches 1 --out "$work/cfg"
grep -q "^A C# #1 tale" "$work/cfg/sample.txt" || { echo "FAIL: config prompt with spaces was cut"; failures=$((failures + 1)); }
# Resumes that must leave --out as it is: nothing left to do, and another folder's checkpoint.
expect_ok "train 6 steps" "$train" "${common[@]}" --out "$work/keep" --steps 6 --ckpt-every 2 --keep-ckpts 0
metrics_before=$(md5sum "$work/keep/metrics.jsonl" | cut -d' ' -f1)
# The same --resume latest line after the run ended: exit 0, nothing written (job scripts rerun it).
expect_ok "finished run, --resume latest" "$train" "${common[@]}" --out "$work/done" --steps 2 --resume latest
sum_before=$(cat "$work/done/metrics.jsonl" "$work/done/checkpoints/"* | md5sum)
"$train" "${common[@]}" --out "$work/done" --steps 2 --resume latest >"$work/done.log" 2>&1 &&
  grep -q "nothing to do: the run in $work/done already ended at step 2" "$work/done.log" &&
  [ "$(cat "$work/done/metrics.jsonl" "$work/done/checkpoints/"* | md5sum)" = "$sum_before" ] &&
  echo "ok   finished run again: exit 0, nothing written" ||
  { echo "FAIL finished run again:"; tail -2 "$work/done.log"; failures=$((failures + 1)); }
expect_error "nothing to do" "nothing to do: the checkpoint is at step 4" \
  "$train" "${common[@]}" --out "$work/keep" --steps 4 --resume "$work/keep/checkpoints/step_4.h5"
[ -e "$work/keep/checkpoints/step_6.h5" ] || { echo "FAIL nothing to do: step_6.h5 was removed"; failures=$((failures + 1)); }
[ "$(md5sum "$work/keep/metrics.jsonl" | cut -d' ' -f1)" = "$metrics_before" ] ||
  { echo "FAIL nothing to do: metrics.jsonl changed"; failures=$((failures + 1)); }
expect_error "another folder's checkpoint" "already holds checkpoints of another run than" \
  "$train" "${common[@]}" --out "$work/keep" --steps 8 --resume "$ckpt"
[ -e "$work/keep/checkpoints/step_6.h5" ] || { echo "FAIL foreign resume: step_6.h5 was removed"; failures=$((failures + 1)); }
[ "$(md5sum "$work/keep/metrics.jsonl" | cut -d' ' -f1)" = "$metrics_before" ] ||
  { echo "FAIL foreign resume: metrics.jsonl changed"; failures=$((failures + 1)); }
expect_ok "another folder's checkpoint into a new --out" "$train" "${common[@]}" --out "$work/fresh" --steps 5 --resume "$ckpt"

# Numbers that would train nonsense, refused before anything runs.
expect_error "NaN learning rate" "--lr-max must be a finite number" "$train" "${common[@]}" --lr-max nan --steps 1
expect_error "beta out of range" "--beta1 must be in \[0, 1)" "$train" "${common[@]}" --beta1 1.5 --steps 1
expect_error "negative weight decay" "--weight-decay must be a finite number" "$train" "${common[@]}" --weight-decay -5 --steps 1
expect_error "no evaluation batches" "--eval-batches must be >= 1" "$train" "${common[@]}" --eval-batches 0 --steps 1
expect_error "negative warm-up" "--warmup must be >= 0" "$train" "${common[@]}" --warmup -10 --steps 1
expect_error "negative seed" "--seed must be >= 0" "$train" "${common[@]}" --seed -1 --steps 1
expect_error "--json without --eval-only" "--json writes the result of --eval-only" "$train" "${common[@]}" --json "$work/x.json" --steps 1
expect_error "empty --out" "--out must name a folder" "$train" "${common[@]}" --out "" --steps 1
# A validation file too short for the context: refused at start-up, not at the first evaluation.
head -c 100 "$work/data/val.bin" >"$work/shortval.bin"
mkdir -p "$work/short" && cp "$work/data/train.bin" "$work/data/meta.json" "$work/short/" && mv "$work/shortval.bin" "$work/short/val.bin"
# A val.bin prepared short (meta.json counting what it holds), not one cut short after.
python3 -c 'import json,os,sys; d=sys.argv[1]; m=json.load(open(d+"/meta.json")); m["val_tokens"]=os.path.getsize(d+"/val.bin")//2; json.dump(m,open(d+"/meta.json","w"))' "$work/short"
expect_error "validation file too short" "needs at least 66 tokens, but '$work/short/val.bin' has 50" \
  "$train" --data "$work/short" --ctx 64 --batch 2 --eval-batches 1 --sample-tokens 0 --steps 3 --out "$work/shortrun"
[ -e "$work/shortrun/checkpoints/step_0.h5" ] && { echo "FAIL short val: training started"; failures=$((failures + 1)); }

# Flags and config files: a folder as config, a name set twice, a switch with a non-boolean value, values a
# single process would otherwise ignore.
expect_error "config is a folder" "is a folder" "$train" "${common[@]}" --config "$work/data" --steps 1
printf 'steps = 2\nsteps = 3\n' >"$work/twice.cfg"
expect_error "config sets a flag twice" "flag 'steps' is set twice in $work/twice.cfg (lines 1 and 2)" \
  "$train" "${common[@]}" --config "$work/twice.cfg"
# A byte order mark (what some Windows editors write first) is not part of the first name.
printf '\xEF\xBB\xBFsteps = 2\n' >"$work/bom.cfg"
expect_ok "config with a byte order mark" "$train" "${common[@]}" --config "$work/bom.cfg" --out "$work/bom"
# One step of a warm-up changes nothing (its learning rate is 0): said so.
"$train" "${common[@]}" --steps 1 --ckpt-every -1 --out "$work/one_step" >"$work/one_step.log" 2>&1 &&
  grep -q "the one step of --steps 1 changes no weight; pass --warmup 0" "$work/one_step.log" &&
  echo "ok   --steps 1 with a warm-up: a note" || { echo "FAIL --steps 1 with a warm-up:"; tail -3 "$work/one_step.log"; failures=$((failures + 1)); }
expect_error "switch value" "flag --overwrite expects on/off, got 'maybe'" "$train" "${common[@]}" --overwrite=maybe --steps 1
expect_error "cuda-graph value" "--cuda-graph takes auto, on or off, got 'maybe'" "$train" "${common[@]}" --cuda-graph maybe --steps 1
expect_error "a flag for a value" "flag --cuda-graph needs a value (next on the command line is --steps;" \
  "$train" "${common[@]}" --cuda-graph --steps 1
expect_error "--no- of a flag with a value" "--cuda-graph takes a value (--cuda-graph off)" "$train" --no-cuda-graph
# Asked for and not possible: said so, and the run goes on.
expect_ok "cuda-graph on, on the CPU" "$train" "${common[@]}" --device cpu --cuda-graph on --steps 1 --ckpt-every -1 \
  --out "$work/graph_cpu"
grep -q "note: --cuda-graph on: CUDA graphs need a CUDA device; the step runs kernel by kernel" "$work/last.log" ||
  { echo "FAIL cuda-graph on, on the CPU: no note"; failures=$((failures + 1)); }
expect_error "recompute-blocks without recompute" "--recompute-blocks 1 needs --recompute selective or block" \
  "$train" "${common[@]}" --recompute-blocks 1 --steps 1
# Out of memory (here the host's, capped by ulimit): the error says which flags would lower it.
expect_error "out of memory" "to fit, lower --batch (--grad-accum keeps the step's batch), add --recompute selective (or block)" \
  bash -c 'ulimit -v 3000000 && exec "$@"' _ "$train" "${common[@]}" --d-model 4096 --d-ff 16384 --layers 4 \
  --heads 32 --steps 1 --out "$work/oom"
[ ! -e "$work/oom" ] || { echo "FAIL out of memory: left a run folder"; failures=$((failures + 1)); }
# Without --data a bad value is refused before the built-in corpus is prepared.
mkdir -p "$work/nodata"
expect_error "bad --steps without --data" "flag --steps expects an integer, got 'abc'" \
  bash -c 'cd "$1" && exec "$2" --steps abc --out runs/x' _ "$work/nodata" "$(realpath "$train")"
[ -z "$(ls -A "$work/nodata")" ] || { echo "FAIL bad --steps without --data: wrote $(ls "$work/nodata")"; failures=$((failures + 1)); }
# The final sample's settings are checked before training, not after it.
expect_error "prompt longer than the context" "--prompt has 40 tokens, more than the context length 16" \
  "$train" "${common[@]}" --sample-tokens 5 --prompt "$(printf 'x%.0s' $(seq 1 40))" --steps 1 --out "$work/prompt"
expect_error "negative top-k" "--top-k must be >= 0" "$train" "${common[@]}" --sample-tokens 5 --top-k -3 --steps 1 \
  --out "$work/prompt"
[ ! -e "$work/prompt" ] || { echo "FAIL sample settings: a run folder was made"; failures=$((failures + 1)); }
expect_error "zero-grads without zero 1" "--zero-grads ddp chooses how --zero 1 averages gradients" \
  "$train" "${common[@]}" --zero-grads ddp --steps 1
expect_error "unknown DDP strategy" "foo" "$train" "${common[@]}" --ddp foo --steps 1
# A bad choice is refused before the built-in corpus is prepared: nothing is written.
mkdir -p "$work/empty_cwd"
(cd "$work/empty_cwd" && "$(realpath "$train")" --zero 9 --device cpu --steps 1 >"$work/zero9.log" 2>&1)
grep -q "error: --zero takes 0, 1, 2 or 3, got '9'" "$work/zero9.log" && [ -z "$(ls -A "$work/empty_cwd")" ] &&
  echo "ok   a bad choice: refused before anything is written" ||
  { echo "FAIL a bad choice: $(cat "$work/zero9.log"); $(ls -A "$work/empty_cwd")"; failures=$((failures + 1)); }
(cd "$work/empty_cwd" && "$(realpath "$train")" --gemm-autotune 33 --device cpu --steps 1 >"$work/at33.log" 2>&1)
grep -q "error: --gemm-autotune takes auto or 0..32 candidates, got 33" "$work/at33.log" &&
  [ -z "$(ls -A "$work/empty_cwd")" ] && echo "ok   a bad --gemm-autotune: refused before anything is written" ||
  { echo "FAIL a bad --gemm-autotune: $(cat "$work/at33.log"); $(ls -A "$work/empty_cwd")"; failures=$((failures + 1)); }
expect_error "bucket of 0 MiB" "--bucket-mb must be positive" "$train" "${common[@]}" --bucket-mb 0 --steps 1
# A bucket size where there are no buckets is not silently ignored (nor refused: a launch script's common
# flags may carry one).
expect_ok "bucket size under ZeRO-2" "$train" "${common[@]}" --zero 2 --bucket-mb 50 --steps 1 --out "$work/bucketzero"
grep -q "note: --bucket-mb is not used: it sizes the buckets of --ddp bucketed, and under mpirun this run reduce-scatters gradients (--zero 2)" \
  "$work/last.log" || { echo "FAIL bucket size under ZeRO-2: no note"; grep note "$work/last.log"; failures=$((failures + 1)); }
expect_ok "bucket size for --ddp flat" "$train" "${common[@]}" --ddp flat --bucket-mb 50 --steps 1 --out "$work/bucketflat"
grep -q "note: --bucket-mb is not used: it sizes the buckets of --ddp bucketed, and under mpirun this run averages gradients with --ddp flat" \
  "$work/last.log" || { echo "FAIL bucket size for --ddp flat: no note"; grep note "$work/last.log"; failures=$((failures + 1)); }
expect_error "negative model size" "--d-model must be >= 0" "$train" "${common[@]}" --d-model -30 --steps 1
# --eval-only takes a run folder (its newest checkpoint) like training does.
expect_ok "eval-only on a run folder" "$train" --eval-only --resume "$(dirname "$(dirname "$ckpt")")" \
  --data "$work/data" --ctx 16 --batch 2 --eval-batches 2
mkdir -p "$work/elsewhere"
train_abs=$(realpath "$train")
(cd "$work/elsewhere" && "$train_abs" --eval-only --resume "$ckpt" --ctx 16 --batch 2 --eval-batches 2) 2>&1 |
  tee "$work/eo.log" | grep -q "from $work/data/val.bin" && echo "ok   eval-only without --data: the checkpoint's data" ||
  { echo "FAIL eval-only without --data did not use the checkpoint's data:"; tail -2 "$work/eo.log"; failures=$((failures + 1)); }
# A log reader that goes away (`| head`) does not end the run: it trains on and writes its checkpoints.
"$train" "${common[@]}" --out "$work/piped" --steps 12 --ckpt-every 6 --log-every 1 | head -1 >/dev/null
status=${PIPESTATUS[0]}
[ "$status" -eq 0 ] && [ -f "$work/piped/checkpoints/step_12.h5" ] && echo "ok   train | head: the run finished" ||
  { echo "FAIL train | head: exit $status, checkpoints: $(ls "$work/piped/checkpoints" 2>&1)"; failures=$((failures + 1)); }
# Training flags left on an --eval-only command line change nothing, and a note says so.
expect_ok "eval-only with training flags" "$train" --eval-only --resume "$ckpt" --data "$work/data" --ctx 16 \
  --batch 2 --eval-batches 1 --steps 50 --lr-max 1 --preset small
grep -q "note: --eval-only ignores --preset, --steps, --lr-max: it evaluates the checkpoint's model as saved" \
  "$work/last.log" || { echo "FAIL eval-only with training flags: no note"; tail -2 "$work/last.log"; failures=$((failures + 1)); }
expect_error "eval-only with init-from" "--init-from is for training" \
  "$train" --eval-only --resume "$ckpt" --init-from "$ckpt" --data "$work/data" --ctx 16
expect_error "eval-only with init-from and no resume" "--init-from is for training" \
  "$train" --eval-only --init-from "$ckpt" --data "$work/data" --ctx 16
# --init-from takes a run folder (its newest checkpoint), and names import for a Hugging Face folder.
expect_ok "init-from a run folder" "$train" "${common[@]}" --out "$work/from_folder" --steps 1 \
  --init-from "$(dirname "$(dirname "$ckpt")")"
grep -q "new run from the weights of .*/checkpoints/step_[0-9]*.h5" "$work/last.log" ||
  { echo "FAIL init-from a run folder: no checkpoint named"; tail -2 "$work/last.log"; failures=$((failures + 1)); }
mkdir -p "$work/hf" && echo '{}' >"$work/hf/config.json" && : >"$work/hf/model.safetensors"
expect_error "init-from a Hugging Face folder" "is a Hugging Face model; make a checkpoint of it first: import --from" \
  "$train" "${common[@]}" --out "$work/from_hf" --steps 1 --init-from "$work/hf"
# A warm-up as long as the run: a note says the learning rate never reaches --lr-max.
expect_ok "warm-up past the end" "$train" "${common[@]}" --out "$work/warm" --steps 2 --warmup 5 --ckpt-every -1
grep -q "note: --warmup 5 is not below --steps 2" "$work/last.log" ||
  { echo "FAIL warm-up past the end: no note"; failures=$((failures + 1)); }
expect_error "prepare_data into /proc" "cannot create --out /proc/tinytrain-test" \
  "$prepare" --input "$work/text" --out /proc/tinytrain-test
expect_error "eval-only logits folder" "--logits $work/nodir/x.npy: cannot write in $work/nodir" \
  "$train" --eval-only --resume "$ckpt" --data "$work/data" --ctx 16 --logits "$work/nodir/x.npy"
# --eval-only's result file is checked before the evaluation; a damaged checkpoint is named.
expect_error "eval-only json folder" "cannot write JSON lines '$work/nodir/x.json'" \
  "$train" --eval-only --resume "$ckpt" --data "$work/data" --ctx 16 --json "$work/nodir/x.json"
cp "$ckpt" "$work/damaged.h5"
size=$(stat -c %s "$work/damaged.h5")
dd if=/dev/zero of="$work/damaged.h5" bs=1 seek=$((size - 4000)) count=4000 conv=notrunc 2>/dev/null
expect_error "damaged checkpoint" "checkpoint $work/damaged.h5 is damaged" \
  "$train" "${common[@]}" --out "$work/fromdamaged" --steps 6 --resume "$work/damaged.h5"

# prepare_data keeps an existing dataset: refused without --overwrite, and untouched by a failed write.
data_sum=$(cat "$work/data/"* | md5sum | cut -d' ' -f1)
expect_error "dataset already in --out" "already holds a dataset" "$prepare" --input "$work/one.txt" --out "$work/data"
expect_error "dataset write on a full disk" "write failed for" \
  bash -c "ulimit -f 1; exec \"$prepare\" --input \"$work/text\" --out \"$work/data\" --separator % --overwrite"
[ "$(cat "$work/data/"* | md5sum | cut -d' ' -f1)" = "$data_sum" ] || { echo "FAIL prepare_data: the dataset changed"; failures=$((failures + 1)); }
ls "$work/data/"*.tmp >/dev/null 2>&1 && { echo "FAIL prepare_data: a temporary file was left"; failures=$((failures + 1)); }
expect_error "a new dataset on a full disk" "write failed for" \
  bash -c "ulimit -f 1; exec \"$prepare\" --input \"$work/text\" --out \"$work/data_new\" --separator %"
[ -e "$work/data_new" ] && { echo "FAIL prepare_data: the new, empty folder was left"; failures=$((failures + 1)); }
# The last file of the dataset fails (a folder in the way of meta.json.tmp): the first ones stay old too.
mkdir "$work/data/meta.json.tmp"
expect_error "dataset's last file fails" "cannot write" \
  "$prepare" --input "$work/one.txt" --out "$work/data" --overwrite
rmdir "$work/data/meta.json.tmp"
[ "$(cat "$work/data/"* | md5sum | cut -d' ' -f1)" = "$data_sum" ] || { echo "FAIL prepare_data: a partly new dataset"; failures=$((failures + 1)); }
ls "$work/data/"*.tmp >/dev/null 2>&1 && { echo "FAIL prepare_data: temporary files were left"; failures=$((failures + 1)); }
# Resumes the same folder reached another way: through a link to the checkpoint, and a foreign resume that
# may replace --out's run with --overwrite.
ln -s "$work/keep/checkpoints/step_4.h5" "$work/latest.h5"
expect_ok "resume through a link into the run's own folder" "$train" "${common[@]}" --out "$work/keep" --steps 7 --resume "$work/latest.h5"
[ -e "$work/keep/checkpoints/step_4.h5" ] || { echo "FAIL linked resume: its checkpoint was removed"; failures=$((failures + 1)); }
expect_ok "foreign resume with --overwrite" "$train" "${common[@]}" --out "$work/keep" --steps 6 --resume "$ckpt" --overwrite
[ -e "$work/keep/checkpoints/step_2.h5" ] && { echo "FAIL foreign resume: the old run's step_2.h5 is still there"; failures=$((failures + 1)); }
# A refused resume into a new folder leaves no folder behind.
expect_error "refused resume, new folder" "nothing to do" "$train" "${common[@]}" --out "$work/brandnew" --steps 4 --resume "$ckpt"
[ -e "$work/brandnew" ] && { echo "FAIL refused resume: $work/brandnew was created"; failures=$((failures + 1)); }

# --init-from: a new run from a checkpoint's weights (fresh optimizer, step 0); not with an explicit --resume.
expect_ok "new run from a checkpoint's weights" "$train" "${common[@]}" --out "$work/init" --steps 2 --init-from "$ckpt"
grep -q "new run from the weights of $ckpt" "$work/last.log" || { echo "FAIL --init-from: no note"; failures=$((failures + 1)); }
expect_error "--init-from with --resume" "pass one of them" \
  "$train" "${common[@]}" --out "$work/init2" --steps 8 --init-from "$ckpt" --resume "$ckpt"
expect_error "--init-from of another shape" "--d-model 32 (the preset's or given) differs from the checkpoint" \
  "$train" "${common[@]}" --d-model 32 --out "$work/init3" --steps 2 --init-from "$ckpt"

# A text file given as --data; a checkpoint cut short (a full disk, a partial copy) is called damaged.
expect_error "data is a text file" "is a file, not a data folder: make one of it with prepare_data" \
  "$train" --data "$work/text/a.txt" --steps 1
head -c 5000 "$ckpt" >"$work/truncated.h5"
expect_error "truncated checkpoint" "is damaged (cut short or overwritten?)" \
  "$train" "${common[@]}" --out "$work/fromtruncated" --steps 6 --resume "$work/truncated.h5"
# Resuming without --data goes on with the run's own data (not the built-in corpus); with other data a note
# says so.
cp -r "$work/run" "$work/run_nodata"
expect_ok "resume without --data" "$train" --ctx 16 --batch 2 --eval-batches 1 --sample-tokens 0 \
  --out "$work/run_nodata" --steps 6 --resume latest
grep -q "data: $work/data (what $work/run_nodata/checkpoints/step_4.h5 was trained on" "$work/last.log" ||
  { echo "FAIL resume without --data: not on the run's data"; head -3 "$work/last.log"; failures=$((failures + 1)); }
# ... and its checkpoints record that data: an evaluation of the new one, without --data, finds it.
expect_ok "eval-only of the resumed run" "$train" --eval-only --resume "$work/run_nodata" --ctx 16 --batch 2 \
  --eval-batches 1
grep -q "from $work/data/val.bin" "$work/last.log" ||
  { echo "FAIL eval-only of the resumed run: $(tail -1 "$work/last.log")"; failures=$((failures + 1)); }
"$prepare" --input "$work/text" --out "$work/data_other" --separator % >/dev/null
expect_ok "resume on other data" "$train" --data "$work/data_other" --ctx 16 --batch 2 --eval-batches 1 \
  --sample-tokens 0 --out "$work/run_other" --steps 6 --resume "$ckpt"
grep -q "note: $ckpt was trained on $work/data; this run goes on with $work/data_other" "$work/last.log" ||
  { echo "FAIL resume on other data: no note"; failures=$((failures + 1)); }
# A relative --data, resumed from another directory: the checkpoint records where the data is; a path with
# blanks reads back whole.
mkdir -p "$work/w1" "$work/w2" "$work/sp ace"
cp -r "$work/data" "$work/w1/mydata" && cp -r "$work/data" "$work/sp ace/my data"
(cd "$work/w1" && "$train" --data mydata --ctx 16 --batch 2 --eval-batches 1 --sample-tokens 0 \
  --out "$work/w1/runs/b" --steps 2 >/dev/null 2>&1)
(cd "$work/w2" && expect_ok "resume from another directory" "$train" --ctx 16 --batch 2 --eval-batches 1 \
  --sample-tokens 0 --out "$work/w1/runs/b" --steps 4 --resume latest)
grep -q "data: $work/w1/mydata (what" "$work/last.log" ||
  { echo "FAIL resume from another directory: $(head -2 "$work/last.log")"; failures=$((failures + 1)); }
"$train" --data "$work/sp ace/my data" --ctx 16 --batch 2 --eval-batches 1 --sample-tokens 0 \
  --out "$work/spaced" --steps 2 >/dev/null 2>&1
expect_ok "resume on data with blanks in its path" "$train" --ctx 16 --batch 2 --eval-batches 1 \
  --sample-tokens 0 --out "$work/spaced" --steps 4 --resume latest
grep -q "data: $work/sp ace/my data (what" "$work/last.log" ||
  { echo "FAIL data with blanks: $(head -2 "$work/last.log")"; failures=$((failures + 1)); }
# A --resume file that does not read, without --data: its error, and nothing prepared where it ran.
mkdir -p "$work/empty_cwd2"
(cd "$work/empty_cwd2" && expect_error "resume a missing file" "checkpoint 'nosuch.h5' does not exist" \
  "$train" --ctx 16 --batch 2 --out "$work/nosuch_run" --steps 2 --resume nosuch.h5)
[ -z "$(ls -A "$work/empty_cwd2")" ] || { echo "FAIL resume a missing file: wrote $(ls -A "$work/empty_cwd2")"; failures=$((failures + 1)); }
# The newest checkpoint (on other data) does not load (its name says step 9, it holds step 6): the one resumed
# was trained on other data than it records, so the user chooses.
mkdir -p "$work/run_mixed/checkpoints"
cp "$ckpt" "$work/run_mixed/checkpoints/step_4.h5"
cp "$work/run_other/checkpoints/step_6.h5" "$work/run_mixed/checkpoints/step_9.h5"
expect_error "newest checkpoint damaged, on other data" "pass --data with the data to go on with" \
  "$train" --ctx 16 --batch 2 --eval-batches 1 --sample-tokens 0 --out "$work/run_mixed" --steps 8 --resume latest
# An evaluation of a checkpoint whose data is gone is refused, not run on the built-in corpus.
cp -r "$work/data" "$work/data_gone"
"$train" --data "$work/data_gone" --ctx 16 --batch 2 --eval-batches 1 --sample-tokens 0 --out "$work/gone_run" \
  --steps 2 >/dev/null 2>&1
rm -rf "$work/data_gone"
expect_error "eval-only, data gone" "was trained on $work/data_gone, which is gone" \
  "$train" --eval-only --resume "$work/gone_run" --ctx 16 --batch 2 --eval-batches 1
expect_error "a token file as --data" "is a file of a data folder: pass --data $work/data" \
  "$train" --data "$work/data/train.bin" --vocab 257 --steps 1
# The default --eval-batches shrinks to what a small val.bin holds (said in a note); an explicit one does not.
expect_ok "default eval batches on small data" "$train" --data "$work/data" --ctx 64 --batch 16 \
  --sample-tokens 0 --out "$work/smallval" --steps 1 --ckpt-every -1
grep -q "note: evaluating on [0-9]* batches, all that $work/data/val.bin holds at --batch 16" "$work/last.log" ||
  { echo "FAIL default eval batches: no note"; failures=$((failures + 1)); }
expect_error "explicit eval batches on small data" "--eval-batches 20 x --batch 16 needs 320 windows" \
  "$train" --data "$work/data" --ctx 64 --batch 16 --eval-batches 20 --sample-tokens 0 --out "$work/smallval2" \
  --steps 1

echo "$failures failure(s)"
[ $failures -eq 0 ]
