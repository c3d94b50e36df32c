#!/usr/bin/env bash
# Where one training step's GPU time goes, ours against torch.compile's, at GPT-2 shapes (vocabulary 50257,
# context 1024, bf16, clip 1.0). Ours: Nsight Compute times every kernel of `benchmark --mode train` (the step
# `train` runs), one warm-up and one measured step, halved. torch.compile: torch.profiler over one step after
# warm-up (apps/python/model_baseline.py --profile-out).
#   scripts/kernel_table.sh BUILD_DIR OUT_DIR [SIZE:BATCH ...]      (default: small:32 xl:8)
# Writes OUT_DIR/kernels_SIZE_BATCH.md (ours) and OUT_DIR/torch_kernels_SIZE_BATCH.md.
set -euo pipefail
build=$1 out=$2
shift 2
cases=("$@")
[ ${#cases[@]} -gt 0 ] || cases=(small:32 xl:8)
mkdir -p "$out"
here=$(cd "$(dirname "$0")" && pwd)
for case in "${cases[@]}"; do
  size=${case%%:*} batch=${case##*:}
  ncu --clock-control none --metrics gpu__time_duration.sum --csv \
    "$build/apps/benchmark" --sizes "$size" --ctx 1024 --batch "$batch" --vocab 50257 --precision bf16 \
    --grad-dtype bf16 --mode train --clip 1.0 --warmup-iters 1 --steps 1 --graph off \
    >"$out/ncu_${size}_$batch.csv" 2>"$out/ncu_${size}_$batch.err"
  python3 "$here/kernel_summary.py" "$out/ncu_${size}_$batch.csv" --divide 2 --top 25 \
    | tee "$out/kernels_${size}_$batch.md"
  rm -f "$out/torch_kernels_${size}_$batch.md"
  timeout 400 python3 "$here/../apps/python/model_baseline.py" --sizes "$size" --ctx 1024 --batch "$batch" \
    --vocab 50257 --variants compile-bf16 --clip 1.0 --warmup 5 --steps 5 \
    --profile-out "$out/torch_kernels_${size}_$batch.md" >/dev/null 2>&1 || true
  cat "$out/torch_kernels_${size}_$batch.md" 2>/dev/null || echo "torch.compile profile failed"
done
