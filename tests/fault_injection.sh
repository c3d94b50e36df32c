#!/usr/bin/env bash
# SIGKILL at random moments of a run that checkpoints every step, ROUNDS times, in one process and in a
# 2-rank job: each time the newest checkpoint loads, and `--resume latest` carries the run on from it.
# Usage: fault_injection.sh MPIEXEC train prepare_data [ROUNDS]
set -uo pipefail
mpiexec=$1 train=$2 prepare=$3 rounds=${4:-20}
work=$(mktemp -d)
trap 'pkill -9 -f "$work" 2>/dev/null; rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
failures=0
fail() { echo "FAIL $*"; failures=$((failures + 1)); }

mkdir -p "$work/text"
for i in $(seq 1 400); do echo "Sentence $i: how vexingly quick daft zebras jump."; echo "%"; done >"$work/text/a.txt"
"$prepare" --input "$work/text" --out "$work/data" --separator % >/dev/null || exit 1
args=(--data "$work/data" --ctx 16 --batch 2 --eval-batches 1 --sample-tokens 0 --device cpu --steps 100000
  --ckpt-every 1 --keep-ckpts 2 --eval-every 0 --log-every 1000 --resume latest)

newest() { ls "$1"/checkpoints/step_*.h5 2>/dev/null | sed 's/.*step_\([0-9]*\).h5/\1 &/' | sort -n | tail -1 | cut -d' ' -f2; }

for ranks in 1 2; do
  out="$work/run$ranks"
  previous=-1
  for round in $(seq 1 "$rounds"); do
    if [ "$ranks" -eq 1 ]; then
      "$train" "${args[@]}" --out "$out" >>"$out.log" 2>&1 &
    else
      "$mpiexec" --oversubscribe --allow-run-as-root -np 2 "$train" "${args[@]}" --out "$out" >>"$out.log" 2>&1 &
    fi
    launcher=$!
    # A random moment: start-up, loading, a step, a checkpoint write, pruning.
    sleep "$(awk -v r=$RANDOM 'BEGIN { printf "%.2f", 0.3 + r / 32767 * 2.0 }')"
    pkill -9 -f -- "--out $out" 2>/dev/null
    kill -9 $launcher 2>/dev/null
    wait $launcher 2>/dev/null
    ckpt=$(newest "$out")
    if [ -z "$ckpt" ]; then
      [ $previous -lt 0 ] || fail "$ranks rank(s), round $round: no checkpoint left"
      continue
    fi
    step=$(basename "$ckpt" .h5 | cut -d_ -f2)
    if "$train" --eval-only --resume "$ckpt" --data "$work/data" --ctx 16 --batch 2 --eval-batches 1 >"$work/eval.log" 2>&1; then
      echo "ok   $ranks rank(s), round $round: newest $(basename "$ckpt") loads"
    else
      fail "$ranks rank(s), round $round: newest $ckpt does not load:"; tail -2 "$work/eval.log"
    fi
    [ "$step" -ge "$previous" ] || fail "$ranks rank(s), round $round: newest step $step is behind $previous"
    previous=$step
  done
  # The run goes on from where the last kill left it.
  "$train" "${args[@]}" --out "$out" --steps $((previous + 2)) >"$work/final.log" 2>&1 ||
    { fail "$ranks rank(s): --resume latest after the last kill"; tail -3 "$work/final.log"; }
  if [ $previous -ge 0 ]; then
    grep -q "resumed from .*step_$previous.h5" "$work/final.log" || fail "$ranks rank(s): did not resume from step $previous"
  fi
done
echo "$failures failure(s)"
[ $failures -eq 0 ]
