#!/usr/bin/env bash
# On a GPU: training 2N steps equals N steps + resume + N steps bit for bit (--deterministic), in f32, in
# bf16 with flash attention, and in bf16 with bf16 gradients (clipped inside AdamW); and the bf16 step
# replayed as a CUDA graph (the default) equals the same step launched kernel by kernel (--cuda-graph off),
# each step's gpu_ms lies within its step_ms, and recomputation (selective, whole blocks) changes nothing.
# Skipped (77) without a CUDA device. Usage: train_resume_gpu.sh train prepare_data
set -euo pipefail
train=$1 prepare=$2
command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1 || { echo "no CUDA device: skipped"; exit 77; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/text"
for i in $(seq 1 400); do echo "Line $i: the five boxing wizards jump quickly over $((i * 7)) fences."; echo "%"; done >"$work/text/a.txt"
"$prepare" --input "$work/text" --out "$work/data" --separator % >/dev/null
# Two checkpoints hold the same parameters: the same bytes, or (where h5py exists) equal datasets.
same_parameters() {
  cmp "$1" "$2" >/dev/null || python3 - "$1" "$2" <<'PY'
import sys
try:
    import h5py, numpy as np
except ImportError:
    sys.exit(0)  # the losses compared before already matched
with h5py.File(sys.argv[1]) as a, h5py.File(sys.argv[2]) as b:
    for name in a["model"]:
        assert np.array_equal(a["model"][name][()], b["model"][name][()]), name
PY
}
for variant in f32 bf16 bf16-grads; do
  precision=${variant%%-*}
  extra=()
  [ "$variant" = bf16-grads ] && extra=(--grad-dtype bf16 --clip 0.5)
  common=(--data "$work/data" --device cuda --deterministic --precision "$precision" --attention flash --ctx 64
          --batch 4 --eval-every 3 --eval-batches 2 --sample-tokens 0 --ckpt-every 3 --warmup 2 --grad-accum 2
          "${extra[@]}")
  "$train" "${common[@]}" --steps 6 --out "$work/full_$variant" >/dev/null
  "$train" "${common[@]}" --steps 3 --out "$work/split_$variant" >/dev/null
  "$train" "${common[@]}" --steps 6 --out "$work/split_$variant" \
    --resume "$work/split_$variant/checkpoints/step_3.h5" >/dev/null
  python3 - "$work/full_$variant/metrics.jsonl" "$work/split_$variant/metrics.jsonl" "$variant" <<'PY'
import json, sys
full = [json.loads(l) for l in open(sys.argv[1])]
split = [json.loads(l) for l in open(sys.argv[2])]
a = [(r["step"], r["loss"], r.get("val_loss")) for r in full]
b = [(r["step"], r["loss"], r.get("val_loss")) for r in split]
assert a == b, (a, b)
print(sys.argv[3], "resume is bit-identical on CUDA:", [x[1] for x in a])
PY
  same_parameters "$work/full_$variant/checkpoints/step_6.h5" "$work/split_$variant/checkpoints/step_6.h5"
done
# Checkpoints and evaluations every 3 steps run the deferred update between replays (optim/overlapped_update.h).
common=(--data "$work/data" --device cuda --deterministic --precision bf16 --attention flash --ctx 64 --batch 4
        --eval-every 3 --eval-batches 2 --sample-tokens 0 --ckpt-every 3 --warmup 2 --grad-accum 2 --steps 6)
"$train" "${common[@]}" --cuda-graph off --out "$work/eager_bf16" >/dev/null
python3 - "$work/full_bf16/metrics.jsonl" "$work/eager_bf16/metrics.jsonl" <<'PY'
import json, sys
rows = [[(r["step"], r["loss"], r["grad_norm"], r.get("val_loss")) for r in map(json.loads, open(p))]
        for p in sys.argv[1:]]
assert rows[0] == rows[1], rows
print("the CUDA graph step equals the eager step bit for bit:", [x[1] for x in rows[0]])
# gpu_ms: the compute stream's span of each step, inside the step's wall time.
for r in (r for p in sys.argv[1:] for r in map(json.loads, open(p))):
    assert 0 < r["gpu_ms"] <= r["step_ms"] + 0.5, r
PY
same_parameters "$work/full_bf16/checkpoints/step_6.h5" "$work/eager_bf16/checkpoints/step_6.h5"
# Recomputation in the CUDA graph step: selective (every block), and the first block whole with the second
# selective, give the losses, gradient norms and parameters of the run without it, bit for bit.
for recompute in "selective" "block --recompute-blocks 1"; do
  name=${recompute%% *}
  # shellcheck disable=SC2086  # the value is two flags
  "$train" "${common[@]}" --recompute $recompute --out "$work/recompute_$name" >/dev/null
  python3 - "$work/full_bf16/metrics.jsonl" "$work/recompute_$name/metrics.jsonl" "$name" <<'PY'
import json, sys
rows = [[(r["step"], r["loss"], r["grad_norm"], r.get("val_loss")) for r in map(json.loads, open(p))]
        for p in sys.argv[1:3]]
assert rows[0] == rows[1], rows
print("recompute", sys.argv[3], "equals no recomputation bit for bit on CUDA:", [x[1] for x in rows[0]])
PY
  same_parameters "$work/full_bf16/checkpoints/step_6.h5" "$work/recompute_$name/checkpoints/step_6.h5"
done
