#!/usr/bin/env bash
# On two GPUs: one rank of a DDP job over NCCL stopped (SIGSTOP) ends the job with a non-zero exit once
# TT_NCCL_TIMEOUT_S has passed, with a line naming what the other rank waited for, and the last checkpoint
# written still loads: with the step launched kernel by kernel, then as a CUDA graph. Stopped before it
# launches a replay, the rank leaves the other waiting inside its replay, whose collectives the watchdog sees
# only as a whole ("the collectives of the step's CUDA graph"); stopped after, its GPU finishes the replay and
# the other waits in the loss's all-reduce. Skipped (77) with fewer than two GPUs.
# Usage: stalled_rank_gpu.sh MPIEXEC train prepare_data
set -uo pipefail
mpiexec=$1 train=$2 prepare=$3
gpus=$(nvidia-smi -L 2>/dev/null | wc -l || true)
[ "${gpus:-0}" -ge 2 ] || { echo "needs 2 GPUs: skipped"; exit 77; }
timeout_s=5
source "$(dirname "$0")/stall_common.sh"

stall() {  # stall on|off: --cuda-graph
  local graph=$1 run="$work/run-$1" log="$work/log-$1"
  # NCCL's all-reduce (the copy engine's step is never a graph). After step 100's checkpoint the ranks talk
  # only in the steps until the next one; a stop that lands in its MPI barrier ends the job after
  # TT_MPI_TIMEOUT_S instead.
  TT_NCCL_TIMEOUT_S=$timeout_s TT_MPI_TIMEOUT_S=20 "$mpiexec" --oversubscribe --allow-run-as-root -np 2 \
    --bind-to none -x TT_NCCL_TIMEOUT_S -x TT_MPI_TIMEOUT_S -x NCCL_NVLS_ENABLE=0 "$train" --data "$work/data" \
    --device cuda --precision bf16 --ctx 32 --batch 2 --all-reduce library --cuda-graph "$graph" \
    --eval-every 100000 --eval-batches 1 --sample-tokens 0 --out "$run" --steps 1000000 --ckpt-every 100 \
    --log-every 100000 >"$log" 2>&1 &
  local launcher=$!
  for _ in $(seq 1 600); do
    [ -e "$run/checkpoints/step_100.h5" ] && break
    sleep 0.1
  done
  local says=off
  grep -q "one CUDA graph" "$log" && says=on
  [ "$says" = "$graph" ] || { echo "FAIL: CUDA graph $says, expected $graph"; cat "$log"; return 1; }
  victim=$(rank_pid "$launcher" "$train" 1)
  [ -n "$victim" ] || { echo "FAIL: no process of rank 1 found"; cat "$log"; return 1; }
  local start status elapsed
  start=$(date +%s)
  kill -STOP "$victim"
  # The bound: anything past it is a hang; the test ends the job itself then.
  for _ in $(seq 1 60); do kill -0 "$launcher" 2>/dev/null || break; sleep 1; done
  kill -0 "$launcher" 2>/dev/null && { kill -9 "$victim"; pkill -9 -P "$launcher"; }
  wait "$launcher"
  status=$?
  elapsed=$(($(date +%s) - start))
  echo "--cuda-graph $graph, stopped rank 1: job exit status $status, ended ${elapsed}s after the stop"
  [ $elapsed -lt 60 ] || { echo "FAIL: the job did not end by itself"; cat "$log"; return 1; }
  [ $status -ne 0 ] || { echo "FAIL: exit status 0"; cat "$log"; return 1; }
  [ $elapsed -ge $timeout_s ] || { echo "FAIL: ended before the bound"; cat "$log"; return 1; }
  local pattern="(NCCL [^;]+ did not (complete|return) within $timeout_s s \(TT_NCCL_TIMEOUT_S\))|(MPI [a-z_ -]+ did not complete within 20 s \(TT_MPI_TIMEOUT_S\))"
  grep -qE "$pattern" "$log" || { echo "FAIL: no line matches '$pattern'"; cat "$log"; return 1; }
  grep -oE "$pattern.*" "$log" | head -1
  local last
  last=$(ls "$run/checkpoints"/step_*.h5 | sort -t_ -k2 -n | tail -1)
  "$train" --eval-only --resume "$last" --data "$work/data" --device cuda --ctx 32 --batch 2 --eval-batches 2 \
    >/dev/null || { echo "FAIL: $last does not load"; return 1; }
  echo "the last checkpoint, $last, loads"
}

stall off && stall on
