#!/usr/bin/env bash
# launch/run_local.sh stops a job without losing it: SIGTERM (or Ctrl-C) to the script becomes SIGUSR2 to
# mpirun, every rank finishes its step, writes the checkpoint and exits 75, and the job resumes from it.
# (mpirun's own answer to SIGTERM kills the ranks a second later and exits 1.)
# Usage: launch_stop.sh PATH/TO/train PATH/TO/prepare_data
set -uo pipefail
train=$1 prepare=$2
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
mkdir -p "$work/text"
for i in $(seq 1 300); do echo "Line $i: a job stopped by its launcher keeps its work."; echo "%"; done >"$work/text/a.txt"
"$prepare" --input "$work/text" --out "$work/data" --separator % >/dev/null || { echo "FAIL prepare_data"; exit 1; }
args=(--data "$work/data" --device cpu --ctx 16 --batch 2 --eval-batches 1 --sample-tokens 0 --log-every 1
      --ckpt-every 0 --out "$work/run")
"$root/launch/run_local.sh" --np 2 --app "$train" "${args[@]}" --steps 100000 >"$work/log" 2>&1 &
pid=$!
for _ in $(seq 1 600); do [ "$(grep -c '^step' "$work/log" 2>/dev/null)" -ge 3 ] && break; sleep 0.1; done
kill -TERM $pid
wait $pid
status=$?
stopped_at=$(grep -o "after step [0-9]*" "$work/log" | head -1 | cut -d' ' -f3)
if [ $status -ne 75 ] || [ -z "$stopped_at" ] || [ ! -e "$work/run/checkpoints/step_$stopped_at.h5" ]; then
  echo "FAIL run_local.sh stopped by SIGTERM: exit $status, expected 75 and a checkpoint"; tail -5 "$work/log"
  exit 1
fi
ls "$work/run/checkpoints" | grep -q '\.tmp$' && { echo "FAIL a temporary checkpoint was left"; exit 1; }
"$root/launch/run_local.sh" --np 2 --app "$train" "${args[@]}" --steps $((stopped_at + 2)) --resume latest \
  >"$work/resume.log" 2>&1 || { echo "FAIL resume"; tail -5 "$work/resume.log"; exit 1; }
grep -q "resumed from $work/run/checkpoints/step_$stopped_at.h5" "$work/resume.log" ||
  { echo "FAIL the resumed job did not start from step $stopped_at"; tail -5 "$work/resume.log"; exit 1; }
echo "ok   run_local.sh: SIGTERM gave exit 75 and the checkpoint of step $stopped_at; the job resumed from it"

# start_job NAME: run_local.sh in the background, once its ranks train; sets $pid (the script) and $mpirun.
start_job() {
  "$root/launch/run_local.sh" --np 2 --app "$train" "${args[@]/$work\/run/$work/$1}" --steps 100000 >"$work/$1.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 600); do [ "$(grep -c '^step' "$work/$1.log" 2>/dev/null)" -ge 3 ] && break; sleep 0.1; done
  mpirun=$(pgrep -x mpirun -P $pid)
}
# gone SECONDS: mpirun has ended within that time.
gone() { for _ in $(seq 1 $(($1 * 10))); do kill -0 "$mpirun" 2>/dev/null || return 0; sleep 0.1; done; return 1; }

# A second stop ends the job now, even with a rank that cannot finish its step (stopped, as a hung one).
start_job hung
kill -STOP $(pgrep -P "$mpirun" | head -1)
kill -TERM $pid; sleep 1; kill -TERM $pid
gone 20 || { echo "FAIL a second SIGTERM did not end a job with a stopped rank"; pkill -9 -P "$mpirun"; kill -9 "$mpirun"; exit 1; }
wait $pid 2>/dev/null
echo "ok   a second SIGTERM ends the job at once"

# The script killed outright: the job does not outlive it.
start_job orphan
disown $pid; kill -9 $pid
gone 20 || { echo "FAIL the job outlived its killed run_local.sh"; pkill -9 -P "$mpirun"; kill -9 "$mpirun"; exit 1; }
echo "ok   the job ends with a killed run_local.sh"

# The launcher's own bad options: one line each, exit 2, nothing started.
for bad in "--np" "--np abc" "--np 0" "--app"; do
  # shellcheck disable=SC2086
  output=$("$root/launch/run_local.sh" $bad 2>&1)
  status=$?
  [ $status -eq 2 ] && [ "$(wc -l <<<"$output")" -eq 1 ] && grep -q "^run_local.sh: " <<<"$output" ||
    { echo "FAIL run_local.sh $bad: exit $status: $output"; exit 1; }
done
echo "ok   bad launcher options: one line each"
