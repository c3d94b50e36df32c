#!/usr/bin/env bash
# Ranks started with different flags (an MPMD launch: one command line per rank) end at start-up with one
# line naming the setting and the ranks, a non-zero exit, and nothing written. Before the check existed, a
# different --steps hung, a different --batch or --lr-max trained silently wrong and a different
# --ckpt-every with --zero 1 corrupted the heap. A bad value given to every rank, data too short for the
# flags, or an --out holding another run is reported once, by rank 0.
# Usage: rank_flags.sh MPIEXEC train prepare_data
set -uo pipefail
mpiexec=$1 train=$2 prepare=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
failures=0
mkdir -p "$work/text"
for i in $(seq 1 300); do echo "Sentence $i: how vexingly quick daft zebras jump."; echo "%"; done >"$work/text/a.txt"
"$prepare" --input "$work/text" --out "$work/data" --separator % >/dev/null || exit 1
common=(--data "$work/data" --ctx 16 --batch 2 --eval-batches 1 --sample-tokens 0 --device cpu --steps 6)

# differ NAME "expected" "rank 0's extra flags" "rank 1's extra flags"
differ() {
  local name=$1 expected=$2 out="$work/$1"
  read -r -a zero <<<"$3"
  read -r -a one <<<"$4"
  local start status output
  start=$(date +%s)
  output=$(timeout 60 "$mpiexec" --oversubscribe --allow-run-as-root -np 1 "$train" "${common[@]}" --out "$out" "${zero[@]}" \
    : -np 1 "$train" "${common[@]}" --out "$out" "${one[@]}" 2>&1)
  status=$?
  if [ $status -eq 0 ] || [ $status -eq 124 ]; then
    echo "FAIL $name: exit status $status"; failures=$((failures + 1)); return
  fi
  if ! grep -q -- "$expected" <<<"$output"; then
    echo "FAIL $name: expected '$expected' in:"; echo "$output" | tail -3; failures=$((failures + 1)); return
  fi
  if ls "$out/checkpoints/"*.h5 >/dev/null 2>&1; then
    echo "FAIL $name: a checkpoint was written"; failures=$((failures + 1)); return
  fi
  echo "ok   $name: exit $status after $(( $(date +%s) - start )) s: $(grep -m1 'disagree' <<<"$output")"
}
differ "steps" "ranks disagree on --steps: rank 0 has 6, rank 1 has 8" "" "--steps 8"
differ "batch" "ranks disagree on --batch: rank 0 has 2, rank 1 has 3" "" "--batch 3"
differ "lr-max" "ranks disagree on --lr-max" "--lr-max 1e-3" "--lr-max 2e-3"
differ "ckpt-every with ZeRO-1" "ranks disagree on --ckpt-every" "--zero 1 --ckpt-every 2" "--zero 1 --ckpt-every 3"
# A value bad on one rank only (which the comparison below would let pass): one line naming the rank.
differ "integer on one rank" "rank 1: flag --steps expects an integer, got '6.0'" "" "--steps 6.0"
# The same values spelled differently agree: a number's forms, a folder with ./ and a trailing slash.
output=$(cd "$work" && timeout 60 "$mpiexec" --oversubscribe --allow-run-as-root -np 1 "$train" "${common[@]}" \
  --out spelled --lr-max 3e-3 --steps 2 : -np 1 "$train" "${common[@]}" --data ./data/ --out ./spelled/ \
  --lr-max 0.003 --steps 2 2>&1)
status=$?
[ $status -eq 0 ] && echo "ok   the same values spelled differently" ||
  { echo "FAIL the same values spelled differently: exit $status:"; echo "$output" | tail -3; failures=$((failures + 1)); }

# A bad value given to every rank alike: one line, from rank 0, and a clean end (no MPI_Abort per rank).
"$train" "${common[@]}" --steps 2 --ckpt-every 2 --out "$work/shaped" >/dev/null 2>&1 ||
  { echo "FAIL a 2-step run"; failures=$((failures + 1)); }
same_bad() {
  local name=$1 expected=$2 output status
  shift 2
  output=$(timeout 60 "$mpiexec" --oversubscribe --allow-run-as-root -np 2 "$train" "${common[@]}" \
    --out "$work/$name" "$@" 2>&1)
  status=$?
  local lines
  lines=$(grep -c -- "$expected" <<<"$output")
  if [ $status -eq 0 ] || [ "$lines" -ne 1 ] || grep -q "^rank [0-9]*:\|MPI_ABORT" <<<"$output"; then
    echo "FAIL $name: exit $status, $lines line(s) with '$expected' in:"; echo "$output" | head -5
    failures=$((failures + 1)); return
  fi
  echo "ok   $name: exit $status: $(grep -m1 -- "$expected" <<<"$output")"
}
same_bad "bad steps" "error: --steps must be positive" --steps 0
same_bad "unknown flag" "error: unknown flag --frobnicate" --frobnicate
# --eval-only runs on rank 0 alone, the others having ended: its failure is its own line, at once.
same_bad "eval-only of a missing checkpoint" "error: --resume $work/missing.h5 does not exist" \
  --eval-only --resume "$work/missing.h5"
same_bad "checkpoint of another shape" "error: --layers 3 (the preset's or given) differs from the checkpoint" \
  --resume "$work/shaped/checkpoints/step_2.h5" --layers 3
same_bad "recompute-blocks beyond the layers" "error: --recompute-blocks must be between 0" \
  --recompute block --recompute-blocks 5
same_bad "--ddp with ZeRO-3" "error: --ddp chooses how DDP (and --zero 1 with --zero-grads ddp) averages gradients" --zero 3 --ddp naive
same_bad "copy-engine all-reduce on the CPU" "error: --all-reduce copy-engine copies gradients between GPUs" \
  --all-reduce copy-engine
same_bad "fewer steps than the checkpoint" "error: nothing to do: the checkpoint is at step 2 and --steps is 1" \
  --resume "$work/shaped/checkpoints/step_2.h5" --steps 1
# Checked by every rank against the same files, or by rank 0 alone against the run folder: one line too.
same_bad "eval batches beyond val.bin" "error: --eval-batches 100000 x --batch 2 x 2 ranks needs 400000 windows" \
  --eval-batches 100000
"$train" "${common[@]}" --steps 2 --out "$work/trained" >/dev/null 2>&1 || { echo "FAIL: a 2-step run"; exit 1; }
same_bad "another run's folder" "already holds checkpoints of another run" --out "$work/trained"

# The apps that write one output run as one process: under mpirun -np 2 each copy says so, nothing written.
output=$(timeout 60 "$mpiexec" --oversubscribe --allow-run-as-root -np 2 "$prepare" --input "$work/text" \
  --out "$work/twice" --separator % 2>&1)
status=$?
if [ $status -ne 0 ] && [ ! -e "$work/twice" ] &&
  grep -q "error: prepare_data runs as one process, but was started as 2 (by mpirun or srun)" <<<"$output"; then
  echo "ok   prepare_data under mpirun -np 2: exit $status, nothing written"
else
  echo "FAIL prepare_data under mpirun -np 2: exit $status:"; echo "$output" | head -3; failures=$((failures + 1))
fi

# srun without an MPI plugin (--mpi=none) starts each task as a world of one; srun gives every task its
# step's task count (SLURM_STEP_NUM_TASKS) and the task's process id (SLURM_TASK_PID), and, with an MPI
# plugin, PMIX_RANK or PMI_RANK. Each copy refuses; a program that a task's shell starts is not a task.
as_srun_task() { # TASKS command...: the command as one of srun's TASKS tasks (this process id)
  local tasks=$1
  shift
  SLURM_STEP_NUM_TASKS=$tasks bash -c 'SLURM_TASK_PID=$$ exec "$@"' _ "$@"
}
for app in train prepare_data; do
  if [ $app = train ]; then
    command=("$train" "${common[@]}" --steps 1 --out "$work/srun_out")
    expected="error: srun started 2 tasks without an MPI plugin, so each would run alone"
  else
    command=("$prepare" --input "$work/text" --out "$work/srun_out" --separator %)
    expected="error: prepare_data runs as one process, but was started as 2 (by mpirun or srun)"
  fi
  output=$(as_srun_task 2 "${command[@]}" 2>&1)
  status=$?
  if [ $status -eq 1 ] && [ ! -e "$work/srun_out" ] && grep -qF "$expected" <<<"$output"; then
    echo "ok   $app as one of 2 srun tasks without MPI: exit 1, nothing written"
  else
    echo "FAIL $app as one of 2 srun tasks without MPI: exit $status:"; echo "$output" | head -3
    failures=$((failures + 1))
  fi
  # Started by a task's shell or script (srun --pty bash): a process of its own, not refused.
  if SLURM_STEP_NUM_TASKS=2 SLURM_TASK_PID=1 timeout 60 "${command[@]}" >/dev/null 2>&1; then
    echo "ok   $app from an srun task's shell"
  else
    echo "FAIL $app from an srun task's shell"; failures=$((failures + 1))
  fi
  rm -rf "$work/srun_out"
  # srun's only task (srun -n 1): a plain single process.
  if as_srun_task 1 "${command[@]}" >/dev/null 2>&1; then
    echo "ok   $app as srun's only task"
  else
    echo "FAIL $app as srun's only task"; failures=$((failures + 1))
  fi
  rm -rf "$work/srun_out"
done

echo "$failures failure(s)"
[ $failures -eq 0 ]
