#!/usr/bin/env bash
# `train`'s own step time at GPT-2 shapes (vocabulary 50257, context 1024, bf16) against the PyTorch reference
# model trained the same way (bf16 autocast, SDPA, fused AdamW, clip_grad_norm 1.0; torch.compile and eager),
# measured in one run on one GPU. Tokens are uniform random ids (the step's time does not depend on them).
#   scripts/train_speed.sh BUILD_DIR OUT_DIR [SIZE:BATCH ...]      (default: small:32 xl:8)
# Writes OUT_DIR/train_speed.md (the table) and the raw logs beside it.
set -euo pipefail
build=$1 out=$2
shift 2
cases=("$@")
[ ${#cases[@]} -gt 0 ] || cases=(small:32 xl:8)
steps=${STEPS:-30}
mkdir -p "$out"
data="$out/gpt2_random"
if [ ! -f "$data/train.bin" ]; then
  mkdir -p "$data"
  python3 - "$data" <<'PY'
import json, sys
import numpy as np
rng = np.random.default_rng(0)
for name, n in (("train.bin", 20_000_000), ("val.bin", 200_000)):
    rng.integers(0, 50257, n, dtype=np.uint16).tofile(f"{sys.argv[1]}/{name}")
json.dump({"tokenizer": "gpt2", "vocab_size": 50257, "end_of_text": 50256}, open(f"{sys.argv[1]}/meta.json", "w"))
PY
fi
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
table="$out/train_speed.md"
{
  echo "GPU: $gpu; $(date -u +%Y-%m-%d); vocabulary 50257, context 1024, bf16; median of steps 6..$steps"
  echo
  echo "| model | batch | train ms | tokens/s | MFU | peak GiB | torch.compile ms | eager (SDPA) ms | vs compile |"
  echo "|---|---|---|---|---|---|---|---|---|"
} >"$table"
for case in "${cases[@]}"; do
  size=${case%%:*} batch=${case##*:}
  run="$out/run_${size}_$batch"
  "$build/apps/train" --preset "$size" --data "$data" --ctx 1024 --batch "$batch" --precision bf16 \
    --steps "$steps" --eval-every 0 --eval-batches 1 --ckpt-every -1 --sample-tokens 0 --log-every 10 \
    --out "$run" --overwrite 2>&1 | tee "$out/train_${size}_$batch.log" | grep -E "^(step|error)" || true
  ours=$(python3 - "$run/metrics.jsonl" "$batch" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])][5:]
ms = statistics.median(r["step_ms"] for r in rows)
mfu = statistics.median(r["mfu"] for r in rows)
tokens = int(sys.argv[2]) * 1024
print(f"{ms:.1f} {tokens / ms * 1e3:.0f} {mfu * 100:.1f}% {max(r.get('peak_mib', 0) for r in rows) / 1024:.1f}")
PY
)
  read -r ms tok mfu peak <<<"$ours"
  PYTHONUNBUFFERED=1 timeout 400 python3 apps/python/model_baseline.py --sizes "$size" --ctx 1024 --batch "$batch" \
    --vocab 50257 --variants compile-bf16,sdpa-bf16 --clip 1.0 --warmup 5 --steps 15 \
    --json "$out/torch_${size}_$batch.jsonl" 2>&1 | tee "$out/torch_${size}_$batch.md" | grep "^|" | tail -2 || true
  read -r compile eager <<<"$(python3 - "$out/torch_${size}_$batch.jsonl" <<'PY'
import json, sys
r = {j["variant"]: j for j in map(json.loads, open(sys.argv[1]))}
f = lambda v: f"{r[v]['step_ms']:.1f}" if v in r and "step_ms" in r[v] else "-"
print(f("compile-bf16"), f("sdpa-bf16"))
PY
)"
  ratio=$(python3 -c "print(f'{$compile / $ms:.2f}x')" 2>/dev/null || echo -)
  echo "| $size | $batch | $ms | $tok | $mfu | $peak | $compile | $eager | $ratio |" | tee -a "$table"
done
cat "$table"
