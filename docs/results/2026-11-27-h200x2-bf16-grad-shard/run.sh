#!/usr/bin/env bash
export LD_LIBRARY_PATH=$PWD/.deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
nvidia-smi -L | tee $OUT/gpus.txt
OUT=$OUT scripts/gpu_report.sh build 2>&1 | tail -1
timeout 200 ctest --test-dir build-gpu -R "dist_gpu_np2|train_transports_gpu" --output-on-failure 2>&1 | tail -8 | tee $OUT/tests.txt
python3 -c "import torch,time
held=[]
for d in range(2):
  free,total=torch.cuda.mem_get_info(d); held.append(torch.empty(total-81559*2**20,dtype=torch.uint8,device=d))
print('ballast placed',flush=True); time.sleep(500)" &
ballast=$!
sleep 20; nvidia-smi --query-gpu=index,memory.used,memory.total --format=csv | tee -a $OUT/gpus.txt
python3 scripts/random_tokens.py /tmp/r32000 32000
for rb in 10 4 0; do
  rec=(--recompute block --recompute-blocks $rb); [ $rb = 0 ] && rec=(--recompute selective)
  nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits -lms 500 > /tmp/apps_$rb.csv &
  smi=$!
  nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits -lms 500 > /tmp/used_$rb.csv &
  used=$!
  timeout 150 mpirun --allow-run-as-root -np 2 --bind-to none -x NCCL_NVLS_ENABLE=0 -x PATH -x LD_LIBRARY_PATH build-gpu/apps/train --preset 7b --data /tmp/r32000 --ctx 2048 --batch 4 --precision bf16 --zero 3 "${rec[@]}" --steps 10 --log-every 1 --ckpt-every -1 --eval-batches 1 --sample-tokens 0 --out /tmp/run7b_$rb --overwrite > $OUT/train_7b_rb$rb.log 2>&1
  kill $smi $used
  grep -E "recomput|error" $OUT/train_7b_rb$rb.log | head -3
  cp /tmp/run7b_$rb/metrics.jsonl $OUT/metrics_7b_rb$rb.jsonl
  # the largest per-process reading of a train process (the ballast is python's)
  maxtrain=$(grep -v "^$ballast," /tmp/apps_$rb.csv | sort -t, -k2 -n | tail -1)
  echo "7b rb$rb: median ms, MFU, peak GiB: $(python3 scripts/median_step.py /tmp/run7b_$rb/metrics.jsonl 2); largest train process (pid, MiB): $maxtrain; card used at most (index, MiB): $(sort -t, -k2 -n /tmp/used_$rb.csv | tail -1)" | tee -a $OUT/report.txt
done
kill $ballast
