#!/usr/bin/env bash
# Stopping one rank of a 2-rank CPU training job (SIGSTOP: alive, but never reaching the next collective)
# ends the whole job with a non-zero exit once the other rank has waited TT_MPI_TIMEOUT_S, with one line
# naming that rank and the collective, and the last checkpoint written still loads. Rank 1 is stopped in
# one job, rank 0 (the one writing checkpoints) in another.
# Usage: stalled_rank.sh MPIEXEC train prepare_data
set -uo pipefail
mpiexec=$1 train=$2 prepare=$3
timeout_s=5
source "$(dirname "$0")/stall_common.sh"

# stall RANK: one job, RANK stopped once step_100.h5 exists.
stall() {
  local victim_rank=$1 run="$work/run$1" log="$work/log$1"
  TT_MPI_TIMEOUT_S=$timeout_s "$mpiexec" --oversubscribe --allow-run-as-root -np 2 -x TT_MPI_TIMEOUT_S \
    "$train" --data "$work/data" --ctx 16 --batch 2 --eval-batches 1 --sample-tokens 0 --device cpu \
    --out "$run" --steps 1000000 --ckpt-every 50 --log-every 100000 >"$log" 2>&1 &
  local launcher=$!
  for _ in $(seq 1 300); do
    [ -e "$run/checkpoints/step_100.h5" ] && break
    sleep 0.1
  done
  victim=$(rank_pid "$launcher" "$train" "$victim_rank")
  [ -n "$victim" ] || { echo "FAIL: no process of rank $victim_rank found"; cat "$log"; return 1; }
  local start status elapsed
  start=$(date +%s)
  kill -STOP "$victim"
  wait "$launcher"
  status=$?
  elapsed=$(($(date +%s) - start))
  echo "stopped rank $victim_rank: job exit status $status, ended ${elapsed}s after the stop"
  [ $status -ne 0 ] || { echo "FAIL: exit status 0"; cat "$log"; return 1; }
  [ $elapsed -ge $timeout_s ] || { echo "FAIL: ended before the bound"; cat "$log"; return 1; }
  [ $elapsed -le 60 ] || { echo "FAIL: took ${elapsed}s"; cat "$log"; return 1; }
  # The other rank reports, once: which rank waited, in which collective, for how long. (The line may
  # follow the progress line, which has no newline of its own.) The stopped rank blames nobody.
  local waiter=$((1 - victim_rank))
  local pattern="(^|[^0-9])rank $waiter: MPI [a-z_ -]+ did not complete within $timeout_s s \(TT_MPI_TIMEOUT_S\); another rank"
  local lines
  lines=$(grep -cE "$pattern" "$log")
  [ "$lines" -eq 1 ] || { echo "FAIL: $lines lines match '$pattern'"; cat "$log"; return 1; }
  grep -oE "rank $waiter: MPI .*" "$log"
  if grep -qE "(^|[^0-9])rank $victim_rank: MPI .* did not complete" "$log"; then
    echo "FAIL: the stopped rank $victim_rank reported a timeout"
    cat "$log"
    return 1
  fi
  local last
  last=$(ls "$run/checkpoints"/step_*.h5 | sort -t_ -k2 -n | tail -1)
  "$train" --eval-only --resume "$last" --data "$work/data" --ctx 16 --batch 2 --eval-batches 2 ||
    { echo "FAIL: $last does not load"; return 1; }
}

stall 1 && stall 0
