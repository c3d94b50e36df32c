#!/usr/bin/env bash
# generate, export, train --init-from and --eval-only --resume read a run folder while its run is still
# writing it, pruning at every step (--ckpt-every 1 --keep-ckpts 1): the newest checkpoint they pick could
# be deleted before or while they read it. They hold a shared lock on it from its check on, which the
# pruning leaves alone, and list the folder again when a file went before they locked it.
# Usage: live_run_reads.sh PATH/TO/train PATH/TO/prepare_data PATH/TO/generate PATH/TO/export
set -uo pipefail
train=$1 prepare=$2 generate=$3 export=$4
work=$(mktemp -d)
trap 'kill "$pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$work"' EXIT
failures=0
fail() { echo "FAIL $*"; failures=$((failures + 1)); }

mkdir -p "$work/text"
for i in $(seq 1 300); do echo "Line $i of a small corpus: a wizard's job is to vex chumps quickly in fog."; echo "%"; done >"$work/text/a.txt"
"$prepare" --input "$work/text" --out "$work/data" --separator % >/dev/null || { echo "FAIL prepare_data"; exit 1; }

"$train" --data "$work/data" --out "$work/run" --preset tiny --ctx 16 --batch 2 --steps 100000 --ckpt-every 1 \
  --keep-ckpts 1 --eval-every 0 --log-every 1000 --sample-tokens 0 --device cpu >"$work/train.log" 2>&1 &
pid=$!
for _ in $(seq 1 100); do [ -n "$(ls "$work/run/checkpoints/" 2>/dev/null)" ] && break; sleep 0.1; done

reads=0
for i in $(seq 1 12); do
  kill -0 "$pid" 2>/dev/null || { fail "the run ended early:"; tail -3 "$work/train.log"; break; }
  "$generate" --checkpoint "$work/run" --prompt "Line" --max-tokens 4 >"$work/gen.log" 2>&1 ||
    { fail "generate on the live run:"; tail -2 "$work/gen.log"; }
  "$export" --checkpoint "$work/run" --out "$work/hf" --overwrite >"$work/export.log" 2>&1 ||
    { fail "export of the live run:"; tail -2 "$work/export.log"; }
  if [ $((i % 4)) -eq 0 ]; then
    "$train" --data "$work/data" --init-from "$work/run" --out "$work/fork$i" --preset tiny --ctx 16 --batch 2 \
      --steps 1 --eval-every 0 --sample-tokens 0 --device cpu >"$work/fork.log" 2>&1 ||
      { fail "train --init-from the live run:"; tail -2 "$work/fork.log"; }
    reads=$((reads + 1))
  fi
  if [ $((i % 2)) -eq 1 ]; then
    "$train" --eval-only --resume "$work/run" --data "$work/data" --ctx 16 --batch 2 --eval-batches 2 \
      --device cpu >"$work/eval.log" 2>&1 || { fail "train --eval-only --resume the live run:"; tail -2 "$work/eval.log"; }
    reads=$((reads + 1))
  fi
  reads=$((reads + 2))
done
kill -USR1 "$pid" 2>/dev/null
wait "$pid"
echo "ok   $reads reads of a live run folder"

# A checkpoint still being read when the run prunes it stays, said once; a later checkpoint removes it once
# it is free. The reader is a Python process holding the shared flock the programs above take.
before=$failures
small=(--data "$work/data" --out "$work/held" --preset tiny --ctx 16 --batch 2 --ckpt-every 1 --keep-ckpts 1
  --eval-every 0 --log-every 1000 --sample-tokens 0 --device cpu)
"$train" "${small[@]}" --steps 2 >"$work/held.log" 2>&1 || { fail "a 2-step run:"; tail -2 "$work/held.log"; }
python3 -c "import fcntl, sys, time
f = open(sys.argv[1], 'rb'); fcntl.flock(f, fcntl.LOCK_SH); time.sleep(60)" "$work/held/checkpoints/step_2.h5" &
reader=$!
sleep 1
"$train" "${small[@]}" --steps 4 --resume latest >"$work/held.log" 2>&1 || { fail "resumed under a reader:"; tail -2 "$work/held.log"; }
[ "$(grep -c "note: $work/held/checkpoints/step_2.h5 is being read by another program" "$work/held.log")" = 1 ] &&
  [ -e "$work/held/checkpoints/step_2.h5" ] && [ ! -e "$work/held/checkpoints/step_3.h5" ] ||
  { fail "a checkpoint being read: not kept once with one note:"; grep note "$work/held.log"; ls "$work/held/checkpoints"; }
kill "$reader"
wait "$reader" 2>/dev/null
"$train" "${small[@]}" --steps 5 --resume latest >"$work/held.log" 2>&1 || { fail "resumed after the reader:"; tail -2 "$work/held.log"; }
[ "$(ls "$work/held/checkpoints")" = "step_5.h5" ] || { fail "a freed checkpoint was not pruned:"; ls "$work/held/checkpoints"; }
grep -q "is being read" "$work/held.log" && fail "a note without a reader"
[ "$failures" -eq "$before" ] && echo "ok   a checkpoint being read is kept, said once, and pruned once free"
[ "$failures" -eq 0 ] || { echo "$failures failures"; exit 1; }
