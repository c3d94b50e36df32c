#!/usr/bin/env bash
# Killing one rank of a 2-rank training job ends the whole job within a bounded time with a non-zero exit,
# and the last checkpoint written still loads. Usage: kill_rank.sh MPIEXEC train prepare_data
set -uo pipefail
mpiexec=$1 train=$2 prepare=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p "$work/text"
for i in $(seq 1 300); do echo "Sentence $i: how vexingly quick daft zebras jump."; echo "%"; done >"$work/text/a.txt"
"$prepare" --input "$work/text" --out "$work/data" --separator % >/dev/null || exit 1
"$mpiexec" --oversubscribe --allow-run-as-root -np 2 "$train" --data "$work/data" --ctx 16 --batch 2 \
  --eval-batches 1 --sample-tokens 0 --device cpu --out "$work/run" --steps 1000000 --ckpt-every 50 \
  --log-every 100000 >"$work/log" 2>&1 &
launcher=$!
# Wait for a checkpoint beyond step 0, then kill one rank (a child of the launcher).
for _ in $(seq 1 200); do
  [ -e "$work/run/checkpoints/step_100.h5" ] && break
  sleep 0.1
done
victim=$(pgrep -P "$launcher" -f "$train" | tail -1)
[ -n "$victim" ] || { echo "FAIL: no rank process found"; cat "$work/log"; exit 1; }
start=$(date +%s)
kill -9 "$victim"
wait "$launcher"
status=$?
elapsed=$(( $(date +%s) - start ))
echo "job exit status $status, ended ${elapsed}s after the kill"
[ $status -ne 0 ] || { echo "FAIL: exit status 0"; exit 1; }
[ $elapsed -le 60 ] || { echo "FAIL: took ${elapsed}s"; exit 1; }
last=$(ls "$work/run/checkpoints"/step_*.h5 | sort -t_ -k2 -n | tail -1)
"$train" --eval-only --resume "$last" --data "$work/data" --ctx 16 --batch 2 --eval-batches 2 || { echo "FAIL: $last does not load"; exit 1; }
