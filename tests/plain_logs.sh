#!/usr/bin/env bash
# train's output redirected to a file, alone and under mpirun (whose ranks write to a pseudo-terminal even
# then), is plain lines: no carriage return, no escape code, and the progress lines carry elapsed time and
# ETA. On a terminal (util-linux `script` provides one) the bar is redrawn in place. A run with --ckpt-every -1
# leaves no empty checkpoints folder.
# Usage: plain_logs.sh MPIEXEC train prepare_data
set -euo pipefail
mpiexec=$1 train=$2 prepare=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p "$work/text"
for i in $(seq 1 300); do echo "Sentence $i: how vexingly quick daft zebras jump."; echo "%"; done >"$work/text/a.txt"
"$prepare" --input "$work/text" --out "$work/data" --separator % >/dev/null
common=(--data "$work/data" --ctx 16 --batch 2 --eval-batches 1 --eval-every 3 --sample-tokens 0 --device cpu
        --steps 6 --log-every 2 --ckpt-every -1)

check_plain() {
  local what=$1 log=$2
  if grep -q $'\r' "$log"; then echo "$what: the log has a carriage return"; cat -A "$log"; exit 1; fi
  if grep -q $'\033' "$log"; then echo "$what: the log has an escape code"; cat -A "$log"; exit 1; fi
  grep -q "step     6/6 .* | elapsed [0-9]*s | ETA 0s" "$log" || { echo "$what: no plain progress line"; cat "$log"; exit 1; }
  echo "$what: plain log ok"
}

"$train" "${common[@]}" --out "$work/alone" >"$work/alone.log" 2>&1
check_plain "train alone" "$work/alone.log"
# --ckpt-every -1 writes no checkpoint, so the run leaves no empty checkpoints folder either.
[ ! -e "$work/alone/checkpoints" ] || { echo "--ckpt-every -1 left $work/alone/checkpoints"; exit 1; }
[ -s "$work/alone/metrics.jsonl" ] || { echo "no metrics.jsonl in $work/alone"; exit 1; }
timeout 120 "$mpiexec" --oversubscribe --allow-run-as-root -np 2 "$train" "${common[@]}" --out "$work/mpi" \
  >"$work/mpi.log" 2>&1
check_plain "train under mpirun -np 2" "$work/mpi.log"

if command -v script >/dev/null && script -qec true /dev/null >/dev/null 2>&1; then
  TERM=xterm script -qec "$(printf '%q ' "$train" "${common[@]}" --out "$work/tty")" /dev/null >"$work/tty.log" 2>&1
  grep -q $'\r\\[#' "$work/tty.log" || { echo "no progress bar on a terminal"; cat -A "$work/tty.log"; exit 1; }
  echo "train on a terminal: progress bar ok"
fi
