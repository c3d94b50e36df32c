#!/usr/bin/env bash
# Where one training step's GPU time goes, ours against torch.compile's (bf16, clip 1.0). Ours: Nsight
# Compute times every kernel of one measured step of `benchmark --mode train` (the step `train` runs; the
# warm-up step is not profiled: --profile-steps). torch.compile: torch.profiler over one step after warm-up
# (apps/python/model_baseline.py --profile-out).
#   scripts/kernel_table.sh BUILD_DIR OUT_DIR [SIZE:BATCH[:CTX[:VOCAB]] ...]
# Default: small:32 xl:8 at GPT-2 shapes (context 1024, vocabulary 50257); 2.7b:4:256:10000 is the course
# configuration. Writes OUT_DIR/kernels_SIZE_BATCH.md (ours) and OUT_DIR/torch_kernels_SIZE_BATCH.md.
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: scripts/kernel_table.sh BUILD_DIR OUT_DIR [SIZE:BATCH[:CTX[:VOCAB]] ...]" >&2; exit 2; }
build=$1 out=$2
shift 2
[ -x "$build/apps/benchmark" ] || { echo "no benchmark in $build/apps: build first" >&2; exit 1; }
command -v ncu >/dev/null || { echo "no ncu (Nsight Compute) on PATH: it times every kernel" >&2; exit 1; }
cases=("$@")
[ ${#cases[@]} -gt 0 ] || cases=(small:32 xl:8)
mkdir -p "$out"
here=$(cd "$(dirname "$0")" && pwd)
for case in "${cases[@]}"; do
  IFS=: read -r size batch ctx vocab <<<"$case"
  ctx=${ctx:-1024} vocab=${vocab:-50257}
  ncu --clock-control none --profile-from-start off --metrics gpu__time_duration.sum --csv \
    "$build/apps/benchmark" --sizes "$size" --device cuda --ctx "$ctx" --batch "$batch" --vocab "$vocab" --precision bf16 \
    --mode train --clip 1.0 --warmup-iters 1 --steps 1 --profile-steps \
    >"$out/ncu_${size}_$batch.csv" 2>"$out/ncu_${size}_$batch.err" ||
    { tail -5 "$out/ncu_${size}_$batch.err" >&2; exit 1; }
  python3 "$here/kernel_summary.py" "$out/ncu_${size}_$batch.csv" --top 25 | tee "$out/kernels_${size}_$batch.md"
  rm -f "$out/torch_kernels_${size}_$batch.md"
  timeout 400 python3 "$here/../apps/python/model_baseline.py" --sizes "$size" --ctx "$ctx" --batch "$batch" \
    --vocab "$vocab" --variants compile-bf16 --clip 1.0 --warmup 5 --steps 5 \
    --profile-out "$out/torch_kernels_${size}_$batch.md" >"$out/torch_${size}_$batch.log" 2>&1 || true
  cat "$out/torch_kernels_${size}_$batch.md" 2>/dev/null ||
    { echo "torch.compile profile failed ($out/torch_${size}_$batch.log):"; tail -3 "$out/torch_${size}_$batch.log"; }
done
