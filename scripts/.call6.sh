#!/usr/bin/env bash
nvidia-smi -L | tee $OUT/gpus.txt
nvidia-smi -L | grep -q H100 || { echo "not H100s"; exit 0; }
export LD_LIBRARY_PATH=$PWD/.deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 CUDA_VISIBLE_DEVICES=0,1
OUT=$OUT scripts/gpu_report.sh build 2>&1 | tail -1
python3 scripts/random_tokens.py /tmp/r32000 32000
for rb in 0 4; do
  rec=(--recompute block --recompute-blocks $rb); [ $rb = 0 ] && rec=(--recompute selective)
  nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits -lms 500 > /tmp/used_$rb.csv &
  used=$!
  timeout 170 mpirun --allow-run-as-root -np 2 --bind-to none -x NCCL_NVLS_ENABLE=0 -x CUDA_VISIBLE_DEVICES -x PATH -x LD_LIBRARY_PATH build-gpu/apps/train --preset 7b --data /tmp/r32000 --ctx 2048 --batch 4 --precision bf16 --zero 3 "${rec[@]}" --steps 10 --log-every 1 --ckpt-every -1 --eval-batches 1 --sample-tokens 0 --out /tmp/run7b_$rb --overwrite > $OUT/train_7b_rb$rb.log 2>&1
  kill $used
  grep -E "^error|out of memory" $OUT/train_7b_rb$rb.log | head -2
  cp /tmp/run7b_$rb/metrics.jsonl $OUT/metrics_7b_rb$rb.jsonl 2>/dev/null
  echo "7b rb$rb on H100: median ms, MFU, peak GiB: $(python3 scripts/median_step.py /tmp/run7b_$rb/metrics.jsonl 2); nvidia-smi max (index, MiB): $(sort -t, -k2 -n /tmp/used_$rb.csv | tail -1)" | tee -a $OUT/report.txt
done
