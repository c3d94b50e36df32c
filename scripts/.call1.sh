#!/usr/bin/env bash
set -uo pipefail
export LD_LIBRARY_PATH=$PWD/.deps/usr/lib/x86_64-linux-gnu
nvidia-smi -L | tee $OUT/gpus.txt
OUT=$OUT scripts/gpu_report.sh build gputests
cp build-gpu/Testing/Temporary/LastTest.log $OUT/ 2>/dev/null
if nvidia-smi -L | grep -q H100; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  python3 scripts/random_tokens.py /tmp/r32000 32000
  nvidia-smi --query-gpu=index,memory.used,power.draw,clocks.sm --format=csv,noheader,nounits -lms 500 >$OUT/smi_7b.csv &
  smi=$!
  timeout 200 mpirun --allow-run-as-root -np 2 --bind-to none -x NCCL_NVLS_ENABLE=0 -x PATH -x LD_LIBRARY_PATH \
    build-gpu/apps/train --preset 7b --data /tmp/r32000 --ctx 2048 --batch 4 --precision bf16 --zero 3 \
    --recompute selective --steps 10 --log-every 1 --ckpt-every -1 --eval-batches 1 --sample-tokens 0 \
    --out /tmp/run7b --overwrite > $OUT/train_7b_h100.log 2>&1
  kill $smi
  cp /tmp/run7b/metrics.jsonl $OUT/metrics_7b_h100.jsonl
  tail -5 $OUT/train_7b_h100.log
  python3 scripts/median_step.py /tmp/run7b/metrics.jsonl 2
  echo "smi max MiB: $(sort -t, -k2 -n $OUT/smi_7b.csv | tail -1)"
fi
