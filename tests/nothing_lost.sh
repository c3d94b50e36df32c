#!/usr/bin/env bash
# Saved work survives what users meet: divergence, a resume that fails, write failures, signals, a second run
# on the same folder, and sizes that cannot run. Each case checks the message, the exit code, and that every
# checkpoint that was good before is still there and loads with a finite loss.
# Usage: nothing_lost.sh PATH/TO/train PATH/TO/prepare_data
set -uo pipefail
train=$1 prepare=$2
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$work"' EXIT
failures=0
fail() { echo "FAIL $*"; failures=$((failures + 1)); }

# run_expect NAME CODE "expected text" command...: the exit code and a line of the output.
run_expect() {
  local name=$1 code=$2 expected=$3
  shift 3
  local status
  output=$("$@" 2>&1)
  status=$?
  if [ "$status" -ne "$code" ]; then
    fail "$name: exit code $status, expected $code:"; echo "$output" | tail -4; return
  fi
  if [ -n "$expected" ] && ! grep -q -- "$expected" <<<"$output"; then
    fail "$name: expected '$expected' in:"; echo "$output" | tail -4; return
  fi
  echo "ok   $name (exit $status)"
}

# loads NAME CHECKPOINT: evaluates to a finite loss.
loads() {
  if "$train" --eval-only --resume "$2" --data "$work/data" --ctx 16 --batch 2 --eval-batches 2 >"$work/eval.log" 2>&1 &&
    grep -q "mean loss [0-9]" "$work/eval.log"; then
    echo "ok   $1: $(basename "$2") loads"
  else
    fail "$1: $2 does not load:"; tail -2 "$work/eval.log"
  fi
}

mkdir -p "$work/text"
for i in $(seq 1 400); do echo "Line $i of a small corpus: the quick brown fox jumps over the lazy dog."; echo "%"; done >"$work/text/a.txt"
"$prepare" --input "$work/text" --out "$work/data" --separator % >/dev/null || { echo "FAIL prepare_data"; exit 1; }
common=(--data "$work/data" --ctx 16 --batch 2 --eval-batches 1 --sample-tokens 0 --log-every 1 --eval-every 0 --device cpu)
losses() { grep -o '"step": [0-9]*, "loss": [^,]*' "$1"; }

# 1. Divergence: stopped before the update; the checkpoint named as last good is there and loads; pruning
# never removed it; a run whose final step diverges exits non-zero too.
div_args=("${common[@]}" --steps 40 --lr-max 1e2 --warmup 2 --ckpt-every 3 --keep-ckpts 1 --clip 0)
run_expect "divergence" 3 "at step [0-9]*; stopped before the update" "$train" "${div_args[@]}" --out "$work/div"
good=$(grep -o "last good checkpoint: [^)]*" <<<"$output" | cut -d' ' -f4)
diverged_at=$(tail -1 "$work/div/metrics.jsonl" | grep -o '"step": [0-9]*' | cut -d' ' -f2)
[ -n "$good" ] && [ -e "$good" ] || fail "divergence: the last good checkpoint '$good' is missing"
[ -n "$good" ] && loads "divergence" "$good"
for f in "$work/div/checkpoints/"step_*.h5; do loads "divergence, every kept checkpoint" "$f"; done
run_expect "divergence on the final step" 3 "stopped before the update" \
  "$train" "${div_args[@]}" --out "$work/div2" --steps $((diverged_at + 1)) --cosine-steps 40
[ -e "$work/div2/checkpoints/step_$((diverged_at + 1)).h5" ] && fail "divergence on the final step: a checkpoint of it was written"

# 2. A resume that fails deletes nothing; a --resume file named with a higher step than it holds stays.
run_expect "train 6 steps, each checkpoint's size and times printed" 0 \
  "checkpoint .*step_6.h5: [0-9.]* [MG]B written in [0-9.]* m*s ([0-9.]* GB/s), verified in [0-9.]* m*s" \
  "$train" "${common[@]}" --out "$work/run" --steps 6 --ckpt-every 2 --keep-ckpts 0
metrics_before=$(md5sum <"$work/run/metrics.jsonl")
run_expect "resume that diverges" 3 "stopped before the update" \
  "$train" "${common[@]}" --out "$work/run" --steps 8 --resume "$work/run/checkpoints/step_2.h5" --lr-max 1e30 --warmup 0 --clip 0
for s in 0 2 4 6; do [ -e "$work/run/checkpoints/step_$s.h5" ] || fail "resume that diverges: step_$s.h5 was removed"; done
[ "$(md5sum <"$work/run/metrics.jsonl")" = "$metrics_before" ] || fail "resume that diverges: metrics.jsonl changed"
run_expect "resume on a full disk" 1 "cannot write checkpoint" bash -c "ulimit -f 20; exec \"$train\" ${common[*]} \
  --out $work/run --steps 8 --resume $work/run/checkpoints/step_2.h5 --ckpt-every 1"
for s in 0 2 4 6; do loads "resume on a full disk" "$work/run/checkpoints/step_$s.h5"; done
[ "$(md5sum <"$work/run/metrics.jsonl")" = "$metrics_before" ] || fail "resume on a full disk: metrics.jsonl changed"
# A resumed run that saves nothing says which steps are lost when it ends, not just the resumed file.
cp -r "$work/run" "$work/nock"
run_expect "resume with --ckpt-every -1" 0 "checkpoint .*step_6.h5 of step 6 (--ckpt-every -1: steps 7 to 8 are not saved)" \
  "$train" "${common[@]}" --out "$work/nock" --steps 8 --resume latest --ckpt-every -1
# --resume latest over checkpoints none of which loads: refused, each file as it was.
mkdir -p "$work/allbad/checkpoints"
for s in 2 4; do head -c 1000 "$work/run/checkpoints/step_$s.h5" >"$work/allbad/checkpoints/step_$s.h5"; done
sums=$(md5sum "$work/allbad/checkpoints/"*)
run_expect "--resume latest, every checkpoint damaged" 1 "--resume latest: no checkpoint in .*allbad/checkpoints loads" \
  "$train" "${common[@]}" --out "$work/allbad" --steps 8 --resume latest
[ "$(md5sum "$work/allbad/checkpoints/"*)" = "$sums" ] || fail "every checkpoint damaged: the files changed"
cp "$work/run/checkpoints/step_2.h5" "$work/run/checkpoints/step_50.h5"
run_expect "resume from a file named step_50 holding step 2" 0 "resumed from .*step_50.h5 at step 2 ([0-9.]* [MG]B read in" \
  "$train" "${common[@]}" --out "$work/run" --steps 9 --resume "$work/run/checkpoints/step_50.h5" --ckpt-every 3
[ -e "$work/run/checkpoints/step_50.h5" ] || fail "misnamed resume: the file resumed from deleted itself"
[ -e "$work/run/checkpoints/step_4.h5" ] && fail "misnamed resume: the replaced step_4.h5 is still there"
loads "misnamed resume" "$work/run/checkpoints/step_9.h5"
run_expect "--resume latest passes over the misnamed file" 0 "note: skipping .*step_50.h5: it holds step 2, not 50" \
  "$train" "${common[@]}" --out "$work/run" --steps 9 --resume latest
grep -q "nothing to do: the run in $work/run already ended at step 9" <<<"$output" ||
  { fail "--resume latest with a misnamed file: not resumed from step_9.h5:"; echo "$output" | tail -3; }

# 4. Write failures of the metrics and the plot are reported at once and end the run; no torn line.
tinymodel=(--d-model 8 --layers 1 --heads 1 --d-ff 8 --ckpt-every 0)
run_expect "metrics on a full disk" 1 "cannot write $work/metrics/metrics.jsonl" bash -c "ulimit -f 250; exec \"$train\" \
  ${common[*]} ${tinymodel[*]} --out $work/metrics --steps 20000"
[ -z "$(tail -c 1 "$work/metrics/metrics.jsonl")" ] || fail "metrics on a full disk: the last line is torn"
python3 -c "import json,sys; [json.loads(l) for l in open(sys.argv[1])]" "$work/metrics/metrics.jsonl" ||
  fail "metrics on a full disk: metrics.jsonl is not whole JSON lines"
mkdir -p "$work/plot" && "$train" "${common[@]}" --out "$work/plot" --steps 1 >/dev/null 2>&1
rm -f "$work/plot/loss.svg" && mkdir "$work/plot/loss.svg.tmp"
run_expect "plot cannot be written" 1 "cannot write $work/plot/loss.svg" \
  "$train" "${common[@]}" --out "$work/plot" --steps 4 --eval-every 2 --resume latest
rmdir "$work/plot/loss.svg.tmp"

# 6. Signals: SIGTERM, SIGINT, SIGUSR1, SIGUSR2 and SIGHUP finish the step, write a checkpoint and exit 75; --resume
# latest then gives the losses of an uninterrupted run, bit for bit. Logs reach a redirected file at once.
# During start-up a stop ends the process at once.
run_expect "uninterrupted" 0 "" "$train" "${common[@]}" --out "$work/whole" --steps 60 --ckpt-every 20
for sig in TERM INT USR1 USR2 HUP; do
  out="$work/sig$sig"
  "$train" "${common[@]}" --out "$out" --steps 60 --ckpt-every 20 --log-every 1 >"$out.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 300); do [ "$(grep -c '^step' "$out.log" 2>/dev/null)" -ge 5 ] && break; sleep 0.02; done
  kill -s "$sig" $pid
  wait $pid
  status=$?
  if [ $status -ne 75 ]; then fail "SIG$sig: exit $status, expected 75"; tail -3 "$out.log"; continue; fi
  grep -q "stopped: got SIG$sig after step [0-9]*; checkpoint .* written" "$out.log" || fail "SIG$sig: no message"
  stopped_at=$(grep -o "after step [0-9]*" "$out.log" | cut -d' ' -f3)
  [ -e "$out/checkpoints/step_$stopped_at.h5" ] || fail "SIG$sig: no checkpoint of step $stopped_at"
  touch "$out/checkpoints/step_99.h5.tmp"
  run_expect "SIG$sig then --resume latest" 0 "resumed from $out/checkpoints/step_$stopped_at.h5" \
    "$train" "${common[@]}" --out "$out" --steps 60 --ckpt-every 20 --resume latest
  [ -e "$out/checkpoints/step_99.h5.tmp" ] && fail "SIG$sig: the stale temporary file is still there"
  [ "$(losses "$out/metrics.jsonl")" = "$(losses "$work/whole/metrics.jsonl")" ] ||
    fail "SIG$sig: the losses differ from the uninterrupted run"
done
# A stop during start-up (here the start point is a FIFO nobody writes: reading it waits) ends the process at
# once, by the signal, and writes nothing.
mkfifo "$work/never_written"
timeout 30 "$train" "${common[@]}" --out "$work/sigearly" --steps 60 --init-from "$work/never_written" \
  >"$work/sigearly.log" 2>&1 &
pid=$!
for _ in $(seq 1 300); do [ -e "$work/sigearly/.lock" ] && break; sleep 0.02; done
sleep 0.2
pkill -TERM -P $pid
wait $pid
status=$?
if [ $status -ne 143 ] || ! grep -q "stop requested during start-up: ending now, nothing written yet" "$work/sigearly.log"; then
  fail "SIGTERM during start-up: exit $status, expected 143 (124: it waited):"; tail -3 "$work/sigearly.log"
elif ls "$work/sigearly/checkpoints/"*.h5 "$work/sigearly/metrics.jsonl" >/dev/null 2>&1; then
  fail "SIGTERM during start-up: something was written"
else echo "ok   SIGTERM during start-up (ended by the signal, nothing written)"; fi
# The same stop asked twice within a step (here small's, seconds long on a CPU) ends the run at once, saying
# what that costs.
"$train" "${common[@]}" --preset small --out "$work/sigtwice_now" --steps 50 --ckpt-every -1 --log-every 1 \
  >"$work/sigtwice_now.log" 2>&1 &
pid=$!
for _ in $(seq 1 1500); do grep -q '^step' "$work/sigtwice_now.log" 2>/dev/null && break; sleep 0.02; done
kill -s INT $pid && sleep 0.02 && kill -s INT $pid
wait $pid
status=$?
if [ $status -ne 130 ] || ! grep -q "stopping at once: nothing since the last complete checkpoint is saved" "$work/sigtwice_now.log"; then
  fail "SIGINT twice: exit $status, expected 130 and the message:"; tail -3 "$work/sigtwice_now.log"
else echo "ok   SIGINT twice within a step (exit 130)"; fi
# A stop after training has ended (during the text sample, here one of hours): the sample is cut short,
# written, and the run exits 0 at once.
out="$work/sigend"
"$train" "${common[@]}" --out "$out" --steps 2 --sample-tokens 100000000 >"$out.log" 2>&1 &
pid=$!
for _ in $(seq 1 600); do grep -q '^done' "$out.log" 2>/dev/null && break; sleep 0.02; done
sleep 0.2
kill -s TERM $pid
for _ in $(seq 1 100); do kill -0 $pid 2>/dev/null || break; sleep 0.1; done
kill -0 $pid 2>/dev/null && { fail "SIGTERM during the sample: still sampling 10 s later"; kill -9 $pid; }
wait $pid
status=$?
if [ $status -ne 0 ] || ! grep -q "stop requested: training has ended" "$out.log" || [ ! -s "$out/sample.txt" ]; then
  fail "SIGTERM during the sample: exit $status, expected 0 with sample.txt"; tail -c 300 "$out.log"
fi
# One stop delivered twice at once (a Ctrl-C to the process group, passed on as SIGTERM by a wrapper): one request.
out="$work/sigtwice"
"$train" "${common[@]}" --out "$out" --steps 60 --ckpt-every 20 --log-every 1 >"$out.log" 2>&1 &
pid=$!
for _ in $(seq 1 300); do [ "$(grep -c '^step' "$out.log" 2>/dev/null)" -ge 5 ] && break; sleep 0.02; done
kill -s INT $pid && kill -s TERM $pid
wait $pid
status=$?
[ $status -eq 75 ] || { fail "SIGINT and SIGTERM at once: exit $status, expected 75"; tail -3 "$out.log"; }
"$train" "${common[@]}" --out "$work/killed" --steps 100000 --ckpt-every 0 >"$work/killed.log" 2>&1 &
pid=$!
sleep 2
kill -9 $pid
wait $pid 2>/dev/null
[ "$(grep -c '^step' "$work/killed.log")" -ge 1 ] || fail "a killed run's redirected log holds no step line"

# 7. A second run on the same --out is refused while the first runs; a killed run's lock goes with it.
"$train" "${common[@]}" --out "$work/busy" --steps 100000 --ckpt-every 0 >/dev/null 2>&1 &
pid=$!
for _ in $(seq 1 300); do [ -e "$work/busy/checkpoints/step_0.h5" ] && break; sleep 0.02; done
run_expect "second run on the same --out" 1 "$work/busy is in use by another training run (pid $pid" \
  "$train" "${common[@]}" --out "$work/busy" --steps 3 --resume latest
kill -9 $pid
wait $pid 2>/dev/null
run_expect "after the first was killed" 0 "resumed from $work/busy/checkpoints/step_0.h5" \
  "$train" "${common[@]}" --out "$work/busy" --steps 3 --resume latest

# 11. Sizes and numbers that cannot run are refused before anything is written; the corrected run starts.
run_expect "absurd batch" 1 "tokens per micro-batch is more than" \
  "$train" "${common[@]}" --out "$work/huge" --steps 3 --batch 100000000000
[ -e "$work/huge" ] && fail "absurd batch: $work/huge was created"
run_expect "corrected rerun" 0 "" "$train" "${common[@]}" --out "$work/huge" --steps 3
run_expect "lr-min above lr-max" 1 "--lr-min 0.1 is above --lr-max 0.01" \
  "$train" "${common[@]}" --out "$work/lr" --steps 3 --lr-min 0.1 --lr-max 0.01
run_expect "resume at a longer context" 1 "--ctx 32 differs from the checkpoint" \
  "$train" "${common[@]}" --ctx 32 --out "$work/longer" --steps 9 --resume "$work/run/checkpoints/step_9.h5"

# 12. A run started ignoring SIGHUP (nohup) keeps ignoring it; SIGTERM still stops it with a checkpoint.
nohup "$train" "${common[@]}" --out "$work/nohup" --steps 100000 --ckpt-every 0 >"$work/nohup.log" 2>&1 &
pid=$!
for _ in $(seq 1 300); do grep -q '^step' "$work/nohup.log" && break; sleep 0.02; done
kill -s HUP $pid
sleep 1
if kill -0 $pid 2>/dev/null; then echo "ok   nohup: SIGHUP ignored"; else fail "nohup: SIGHUP ended the run"; fi
kill -s TERM $pid
wait $pid
status=$?
[ $status -eq 75 ] || { fail "nohup run stopped by SIGTERM: exit $status, expected 75"; tail -3 "$work/nohup.log"; }

# 13. Resuming an older checkpoint of the folder says what it will replace, and only replaces it once it has
# trained; --overwrite over another run removes nothing until a checkpoint of trained steps (a run failing
# in its first step leaves the other run whole).
run_expect "a 3-step run" 0 "" "$train" "${common[@]}" --out "$work/older" --steps 3 --ckpt-every 1
run_expect "resume from step 1" 0 "note: step_2.h5, step_3.h5 in $work/older/checkpoints are replaced" \
  "$train" "${common[@]}" --out "$work/older" --steps 3 --ckpt-every 1 --resume "$work/older/checkpoints/step_1.h5"
run_expect "resume with another schedule and seed" 0 "note: --seed 1 -> 7 differs from the run" \
  "$train" "${common[@]}" --out "$work/older" --steps 3 --ckpt-every 1 --resume "$work/older/checkpoints/step_2.h5" \
  --seed 7 --lr-max 0.01
grep -q -- "pass --lr-max 3e-3 to keep its schedule" <<<"$output" || fail "the schedule note: $output"
for i in $(seq 1 8000); do echo "Sentence $i: how vexingly quick daft zebras jump."; echo "%"; done >"$work/text/a.txt"
"$prepare" --input "$work/text" --out "$work/big" --separator % >/dev/null || fail "prepare the larger data"
output=$(bash -c 'ulimit -v 2000000; exec "$@"' _ "$train" --data "$work/big" --ctx 1024 --batch 32 \
  --eval-batches 1 --sample-tokens 0 --device cpu --out "$work/older" --steps 3 --overwrite 2>&1)
grep -q "out of host memory" <<<"$output" || { fail "the overwriting run did not run out of memory:"; echo "$output" | tail -2; }
for step in 1 2 3; do
  loads "the overwritten run's step $step" "$work/older/checkpoints/step_$step.h5"
done

# 14. What a later run in the same folder could lose or change unsaid. A resume without --keep-ckpts keeps
# the checkpoints the run kept (here all of them); a new run does not replace the metrics of a run that wrote
# no checkpoint without --overwrite (--resume latest takes it over, as the restart of that run); files of the
# user's that end in .tmp stay; the same forked resume run again is pointed at --resume latest; data
# replaced at its path, another validation split and an unused --init-from each get a note.
run_expect "keep every checkpoint" 0 "" "$train" "${common[@]}" --out "$work/keep" --steps 4 --ckpt-every 1 --keep-ckpts 0
run_expect "resume keeps them" 0 "keeping every checkpoint, as the run did (--keep-ckpts 0)" \
  "$train" "${common[@]}" --out "$work/keep" --steps 6 --cosine-steps 4 --ckpt-every 1 --resume latest
[ "$(ls "$work/keep/checkpoints" | wc -l)" -eq 7 ] || fail "resume pruned: $(ls "$work/keep/checkpoints")"
run_expect "a run without checkpoints" 0 "" "$train" "${common[@]}" --out "$work/nock2" --steps 3 --ckpt-every -1
run_expect "a new run over its metrics" 1 "nock2/metrics.jsonl holds the metrics of another run" \
  "$train" "${common[@]}" --out "$work/nock2" --steps 2 --ckpt-every -1
[ "$(wc -l <"$work/nock2/metrics.jsonl")" -eq 3 ] || fail "the refused run changed the metrics"
run_expect "--resume latest over them" 0 "replacing $work/nock2/metrics.jsonl, of a run that left no checkpoint" \
  "$train" "${common[@]}" --out "$work/nock2" --steps 2 --ckpt-every -1 --resume latest
echo "the user's" >"$work/nock2/notes.tmp"
run_expect "a run beside a user's .tmp file" 0 "" "$train" "${common[@]}" --out "$work/nock2" --steps 2 --overwrite
[ -e "$work/nock2/notes.tmp" ] || fail "train removed the user's notes.tmp"
run_expect "a forked run" 0 "" "$train" "${common[@]}" --out "$work/fork" --steps 5 --ckpt-every 1 \
  --resume "$work/keep/checkpoints/step_2.h5"
run_expect "the same fork again" 1 "as this one is (the same command, stopped before?); pass --resume latest" \
  "$train" "${common[@]}" --out "$work/fork" --steps 6 --ckpt-every 1 --resume "$work/keep/checkpoints/step_2.h5"
for i in $(seq 1 200); do echo "Other text $i: pack my box with five dozen liquor jugs."; echo "%"; done >"$work/text/a.txt"
cp -r "$work/data" "$work/data_kept"
"$prepare" --input "$work/text" --out "$work/data" --separator % --overwrite >/dev/null || fail "prepare other data"
run_expect "data replaced at its path" 0 "the data changed, so the losses will not match" \
  "$train" "${common[@]}" --out "$work/keep" --steps 7 --cosine-steps 4 --ckpt-every 1 --resume latest
rm -rf "$work/data" && mv "$work/data_kept" "$work/data"
run_expect "another split of the batch" 0 "validation reads 1 window of val.bin, against 2" \
  "$train" "${common[@]}" --out "$work/keep" --steps 8 --cosine-steps 4 --ckpt-every 1 --resume latest \
  --batch 1 --grad-accum 2
run_expect "an unused --init-from" 0 "note: --init-from $work/fork is not used" \
  "$train" "${common[@]}" --out "$work/keep" --steps 9 --cosine-steps 4 --ckpt-every 1 --resume latest \
  --batch 1 --grad-accum 2 --init-from "$work/fork"

echo "$failures failure(s)"
[ $failures -eq 0 ]
