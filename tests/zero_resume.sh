#!/usr/bin/env bash
# Checkpoints load at any world size and ZeRO stage: a ZeRO-1 checkpoint written by 2 ranks resumes at 3
# ranks sharded and unsharded, and a ZeRO-3 one written by 2 ranks resumes at 3 ranks with every stage (and
# a stage-0 one from 3 ranks at 2 ranks with ZeRO-3), all with the same losses as the unsharded run; and they
# load in a single process. A truncated or damaged checkpoint ends the job with one line from the rank that
# found it. Usage: zero_resume.sh MPIEXEC train prepare_data
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
# The same global batch at another rank count draws other random batches: a note says so.
"$train" "${common[@]}" --batch 4 --steps 4 --resume "$ckpt" --out "$work/single_b4" >"$work/single_b4.log"
grep -q "note: at 1 rank the random batches differ from those of the run that wrote the checkpoint (2 ranks)" \
  "$work/single_b4.log" || { echo "FAIL no note on the random batches at another rank count"; exit 1; }
# ZeRO-2 and 3 from the ZeRO-1 checkpoint, with gradient accumulation and recomputation in one of them.
"${mpi[@]}" -np 3 "$train" "${common[@]}" --zero 2 --steps 6 --resume "$ckpt" --out "$work/zero2" >/dev/null
"${mpi[@]}" -np 3 "$train" "${common[@]}" --zero 3 --recompute block --steps 6 --resume "$ckpt" \
  --out "$work/zero3" >/dev/null
# A ZeRO-3 checkpoint from 2 ranks (its step 0 written before sharding, step 3 from the shards) resumes at 2
# ranks unsharded as the ZeRO-3 run went on, and at 3 ranks unsharded and with ZeRO-2; a stage-0 checkpoint
# from 3 ranks resumes at 2 ranks with ZeRO-3.
"${mpi[@]}" -np 2 "$train" "${common[@]}" --zero 3 --steps 6 --ckpt-every 3 --out "$work/first3" >/dev/null
ckpt3="$work/first3/checkpoints/step_3.h5"
# At the same world size the resumed run sees the same batches: it must repeat the uninterrupted one.
"${mpi[@]}" -np 2 "$train" "${common[@]}" --zero 0 --steps 6 --resume "$ckpt3" --out "$work/from3_np2" >/dev/null
"${mpi[@]}" -np 3 "$train" "${common[@]}" --zero 0 --steps 6 --resume "$ckpt3" --out "$work/from3_whole" >/dev/null
"${mpi[@]}" -np 3 "$train" "${common[@]}" --zero 2 --steps 6 --resume "$ckpt3" --out "$work/from3_zero2" >/dev/null
"${mpi[@]}" -np 3 "$train" "${common[@]}" --zero 0 --steps 4 --ckpt-every 4 --resume "$ckpt3" \
  --out "$work/from3_np3" >/dev/null
"${mpi[@]}" -np 2 "$train" "${common[@]}" --zero 3 --steps 6 --resume "$work/from3_np3/checkpoints/step_4.h5" \
  --out "$work/back_to_2" >/dev/null
"${mpi[@]}" -np 2 "$train" "${common[@]}" --zero 0 --steps 6 --resume "$work/from3_np3/checkpoints/step_4.h5" \
  --out "$work/back_to_2_whole" >/dev/null
"$train" "${common[@]}" --steps 4 --resume "$ckpt3" --out "$work/single3" >/dev/null
# A new run from a checkpoint's weights alone loads them into the shards too.
for zero in 0 2 3; do
  "${mpi[@]}" -np 3 "$train" "${common[@]}" --zero $zero --steps 2 --ckpt-every -1 --init-from "$ckpt3" \
    --out "$work/init$zero" >/dev/null
done
python3 - "$work" <<'PY'
import json, sys
work = sys.argv[1]
def losses(name):
    return [(r["step"], r["loss"]) for r in map(json.loads, open(f"{work}/{name}/metrics.jsonl"))]
def same(name, reference, steps):
    a, b = losses(name), losses(reference)
    assert [s for s, _ in a] == steps == [s for s, _ in b], (name, a, b)
    for (_, x), (_, y) in zip(a, b):
        assert abs(x - y) <= 1e-6 * abs(y), (name, x, y)
for name in ["sharded", "sharded_ddp", "zero2", "zero3"]:
    same(name, "whole", [4, 5, 6])
same("from3_zero2", "from3_whole", [4, 5, 6])
a, b = losses("from3_np2"), losses("first3")[3:]
assert [s for s, _ in a] == [4, 5, 6] == [s for s, _ in b], (a, b)
for (_, x), (_, y) in zip(a, b):
    assert abs(x - y) <= 1e-6 * abs(y), ("a ZeRO-3 checkpoint resumed unsharded", x, y)
same("back_to_2", "back_to_2_whole", [5, 6])
same("init2", "init0", [1, 2])
same("init3", "init0", [1, 2])
print("resumed across stages and world sizes with the same losses:", losses("zero3"), losses("from3_zero2"))
PY

# Ranks load a checkpoint together, each dataset read and verified by one rank (the one with the fewest bytes
# so far: the embedding is rank 0's, the model's second dataset rank 1's): damage ends the whole job with the
# reading rank's one-line error, not a hang, and the other rank never reads the damaged dataset.
damaged_run() {  # DATASET READER OTHER
  local dataset=$1 reader=$2 other=$3 status=0 output
  cp "$ckpt3" "$work/damaged.h5"
  /usr/bin/python3 "$(dirname "$0")/flip_byte.py" "$work/damaged.h5" "$dataset"
  output=$(timeout 120 "${mpi[@]}" -np 2 "$train" "${common[@]}" --zero 3 --steps 6 --resume "$work/damaged.h5" \
    --out "$work/damaged_run" 2>&1) || status=$?
  local expected="rank $reader: checkpoint $work/damaged.h5 is damaged: checksum mismatch in /$dataset"
  if [ $status -eq 0 ] || [ $status -eq 124 ] || ! grep -q "$expected" <<<"$output" ||
    grep -q "rank $other: .*damaged" <<<"$output"; then
    echo "FAIL damaged $dataset at 2 ranks: exit $status, expected '$expected' (and no rank $other line) in:"
    echo "$output" | tail -5
    exit 1
  fi
  echo "ok   damaged $dataset at 2 ranks: exit $status, $(grep -m1 'damaged' <<<"$output")"
}
# A start point that every rank would fail to open (truncated) is opened by rank 0 first: one error line for
# the job, exit 1, and no rank taking mpirun's SIGTERM for a stop request.
head -c 5000 "$ckpt3" >"$work/truncated.h5"
status=0
output=$(timeout 120 "${mpi[@]}" -np 3 "$train" "${common[@]}" --zero 3 --steps 6 --resume "$work/truncated.h5" \
  --out "$work/truncated_run" 2>&1) || status=$?
if [ $status -ne 1 ] || [ "$(grep -c "is damaged (cut short or overwritten?)" <<<"$output")" -ne 1 ] ||
  grep -q "stop requested" <<<"$output"; then
  echo "FAIL truncated checkpoint at 3 ranks: exit $status, expected 1 and one error line in:"
  echo "$output" | tail -8
  exit 1
fi
echo "ok   truncated checkpoint at 3 ranks: $(grep "is not a readable" <<<"$output")"
if /usr/bin/python3 -c "import h5py" 2>/dev/null; then
  damaged_run model/token_embeddings.weight 0 1
  damaged_run model/layers.0.attn.q_proj.weight 1 0
else
  echo "SKIP damaged checkpoints at 2 ranks: Debian's python3-h5py is missing"
fi

# An evaluation shares the global batch's windows among the ranks: 2 ranks at --batch 2 evaluate (and, with
# sequential batches, train on) what one process at --batch 4 does.
"${mpi[@]}" -np 2 "$train" "${common[@]}" --sampling sequential --eval-batches 3 --eval-every 2 --steps 4 \
  --ckpt-every -1 --out "$work/eval_np2" >/dev/null
"$train" "${common[@]}" --batch 4 --sampling sequential --eval-batches 3 --eval-every 2 --steps 4 \
  --ckpt-every -1 --out "$work/eval_np1" >/dev/null
python3 - "$work/eval_np2/metrics.jsonl" "$work/eval_np1/metrics.jsonl" <<'PY'
import json, sys
runs = [[(r["step"], r["loss"], r.get("val_loss")) for r in map(json.loads, open(p))] for p in sys.argv[1:]]
vals = [[(s, v) for s, _, v in run if v is not None] for run in runs]
assert [s for s, _ in vals[0]] == [2, 4] == [s for s, _ in vals[1]], vals
for (_, a), (_, b) in zip(*vals):
    assert abs(a - b) <= 1e-6 * abs(b), vals
for (_, a, _), (_, b, _) in zip(*runs):
    assert abs(a - b) <= 1e-5 * abs(b), runs
print("ok   2 ranks at batch 2 evaluate what 1 process at batch 4 does:", vals[0], vals[1])
PY
