#!/usr/bin/env bash
# A ZeRO-1 checkpoint written by 2 ranks resumes at 3 ranks, sharded and unsharded, with the same losses,
# and loads in a single process. Usage: zero_resume.sh MPIEXEC train prepare_data
set -euo pipefail
mpiexec=$1 train=$2 prepare=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpi=("$mpiexec" --oversubscribe --allow-run-as-root)
mkdir -p "$work/text"
for i in $(seq 1 300); do echo "Sentence $i: pack my box with five dozen liquor jugs."; echo "%"; done >"$work/text/a.txt"
"$prepare" --input "$work/text" --out "$work/data" --separator % >/dev/null
common=(--data "$work/data" --ctx 16 --batch 2 --eval-batches 1 --sample-tokens 0 --log-every 100 --device cpu)
"${mpi[@]}" -np 2 "$train" "${common[@]}" --zero 1 --steps 3 --ckpt-every 3 --out "$work/first" >/dev/null
ckpt="$work/first/checkpoints/step_3.h5"
"${mpi[@]}" -np 3 "$train" "${common[@]}" --zero 1 --steps 6 --resume "$ckpt" --out "$work/sharded" >/dev/null
"${mpi[@]}" -np 3 "$train" "${common[@]}" --zero 0 --steps 6 --resume "$ckpt" --out "$work/whole" >/dev/null
# The same, with ZeRO's gradients averaged by the bucketed DDP all-reduce instead of a reduce-scatter.
"${mpi[@]}" -np 3 "$train" "${common[@]}" --zero 1 --zero-grads ddp --bucket-mb 0.001 --steps 6 --resume "$ckpt" \
  --out "$work/sharded_ddp" >/dev/null
"$train" "${common[@]}" --steps 4 --resume "$ckpt" --out "$work/single" >/dev/null
python3 - "$work/sharded/metrics.jsonl" "$work/whole/metrics.jsonl" "$work/sharded_ddp/metrics.jsonl" <<'PY'
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
c = [json.loads(l) for l in open(sys.argv[3])]
assert [r["step"] for r in a] == [4, 5, 6] == [r["step"] for r in b] == [r["step"] for r in c], (a, b, c)
for x, y, z in zip(a, b, c):
    assert abs(x["loss"] - y["loss"]) <= 1e-6 * abs(y["loss"]), (x["loss"], y["loss"])
    assert abs(z["loss"] - y["loss"]) <= 1e-6 * abs(y["loss"]), (z["loss"], y["loss"])
print("resumed at 3 ranks, sharded vs unsharded losses:", [(r["loss"], s["loss"]) for r, s in zip(a, b)])
PY
