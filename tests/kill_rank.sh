#!/usr/bin/env bash
# Killing one rank of a 2-rank training job ends the whole job within a bounded time with a non-zero exit,
# and the last checkpoint written still loads; a rank failing in the first step leaves a folder the corrected
# command reuses. Usage: kill_rank.sh MPIEXEC train prepare_data
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

# A rank that fails in the first step of a new run (here rank 1 out of host memory, under a ulimit): mpirun
# ends the job with SIGTERM. Rank 0 must not claim it is writing a checkpoint, and the start point it wrote
# must not make the corrected command (same --out, no --overwrite) refuse the folder. val.bin holds one
# evaluation batch of both ranks (64 windows of 1025 tokens).
for i in $(seq 1 16000); do echo "Sentence $i: how vexingly quick daft zebras jump."; echo "%"; done >"$work/text/a.txt"
"$prepare" --input "$work/text" --out "$work/big" --separator % >/dev/null || exit 1
cat >"$work/limit_rank1.sh" <<'WRAP'
#!/usr/bin/env bash
if [ "${OMPI_COMM_WORLD_RANK:-}" = 1 ]; then ulimit -v 2000000; fi
exec "$@"
WRAP
chmod +x "$work/limit_rank1.sh"
first=(--data "$work/big" --ctx 1024 --eval-batches 1 --sample-tokens 0 --device cpu --out "$work/oom" --steps 2)
timeout 120 "$mpiexec" --oversubscribe --allow-run-as-root -np 2 "$work/limit_rank1.sh" "$train" "${first[@]}" \
  --batch 32 >"$work/oom.log" 2>&1
status=$?
grep -q "rank 1: out of host memory" "$work/oom.log" || { echo "FAIL: rank 1 did not run out of memory (exit $status):"; tail -5 "$work/oom.log"; exit 1; }
if grep -q "writing a checkpoint" "$work/oom.log"; then echo "FAIL: a checkpoint was announced:"; cat "$work/oom.log"; exit 1; fi
timeout 120 "$mpiexec" --oversubscribe --allow-run-as-root -np 2 "$train" "${first[@]}" --batch 2 >"$work/rerun.log" 2>&1 ||
  { echo "FAIL: the corrected rerun:"; tail -3 "$work/rerun.log"; exit 1; }
grep "replacing" "$work/rerun.log"
echo "ok: a rank out of memory in step 1, then the rerun in the same folder"
