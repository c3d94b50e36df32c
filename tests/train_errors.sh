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
expect_error "another run's checkpoints in --out" "already holds checkpoints of another run" \
  "$train" "${common[@]}" --out "$work/run" --steps 2
[ -e "$ckpt" ] || { echo "FAIL: the refused run removed $ckpt"; failures=$((failures + 1)); }
sum_before=$(md5sum "$ckpt" | cut -d' ' -f1)
expect_error "checkpoint of another shape" "dataset /model/token_embeddings.weight has shape" \
  "$train" "${common[@]}" --d-model 32 --out "$work/other" --steps 6 --resume "$ckpt"
expect_error "missing checkpoint" "does not exist" "$train" "${common[@]}" --out "$work/run" --steps 6 --resume "$work/none.h5"
expect_error "NaN loss" "loss is [A-Za-z]* at step [0-9]*; stopping (last good checkpoint: $ckpt)" \
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
expect_error "bad gradient dtype" "--grad-dtype must be f32 or bf16, got 'f16'" "$train" "${common[@]}" --grad-dtype f16 --steps 1
expect_ok "bf16 gradients train" "$train" "${common[@]}" --precision bf16 --grad-dtype bf16 --steps 3 --out "$work/bf16grads"
grep -q '"loss"' "$work/bf16grads/metrics.jsonl" || { echo "FAIL: no metrics from the bf16-gradient run"; failures=$((failures + 1)); }

# A single text file without separators still gets a validation split; config values may contain spaces.
printf 'Once there was a tiny model.\nIt read the same lines again and again.\n%.0s' $(seq 1 200) >"$work/one.txt"
expect_ok "prepare_data on one file" "$prepare" --input "$work/one.txt" --out "$work/one"
printf 'steps = 2\nprompt = Once upon a time\nsample-tokens = 5\n' >"$work/run.cfg"
expect_ok "config file" "$train" --config "$work/run.cfg" --data "$work/one" --ctx 16 --batch 2 --eval-batches 1 --out "$work/cfg"
grep -q "^Once upon a time" "$work/cfg/sample.txt" || { echo "FAIL: config prompt with spaces was cut"; failures=$((failures + 1)); }
echo "$failures failure(s)"
[ $failures -eq 0 ]
