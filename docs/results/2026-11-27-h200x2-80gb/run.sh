nvidia-smi -L | tee $OUT/gpus.txt
python3 -c "import torch,time,sys
for d in range(2):
  free,total=torch.cuda.mem_get_info(d); n=total-81559*2**20
  globals()[\"b%d\"%d]=torch.empty(n,dtype=torch.uint8,device=d)
print(\"ballast placed\",flush=True); time.sleep(400)" &
sleep 20; nvidia-smi --query-gpu=index,memory.used,memory.total --format=csv | tee -a $OUT/gpus.txt
export LD_LIBRARY_PATH=$PWD/.deps/usr/lib/x86_64-linux-gnu
OUT=$OUT scripts/gpu_report.sh build 2>&1 | tee $OUT/report.txt
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
python3 scripts/random_tokens.py /tmp/r32000 32000
for rb in 10 8; do
  nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits -lms 500 > /tmp/smi_$rb.csv &
  smi=$!
  timeout 120 mpirun --allow-run-as-root -np 2 --bind-to none -x NCCL_NVLS_ENABLE=0 -x PATH -x LD_LIBRARY_PATH build-gpu/apps/train --preset 7b --data /tmp/r32000 --ctx 2048 --batch 4 --precision bf16 --zero 3 --recompute block --recompute-blocks $rb --steps 10 --log-every 1 --ckpt-every -1 --eval-batches 1 --sample-tokens 0 --out /tmp/run7b_$rb --overwrite > $OUT/train_7b_rb$rb.log 2>&1
  kill $smi
  grep -E "recomputation|error" $OUT/train_7b_rb$rb.log
  cp /tmp/run7b_$rb/metrics.jsonl $OUT/metrics_7b_rb$rb.jsonl
  echo "7b rb$rb (rest selective): median ms, MFU, peak GiB: $(python3 scripts/median_step.py /tmp/run7b_$rb/metrics.jsonl 2); nvidia-smi max MiB $(sort -t, -k2 -n /tmp/smi_$rb.csv | tail -1)" | tee -a $OUT/report.txt
done
