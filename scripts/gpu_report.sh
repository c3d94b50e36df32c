#!/usr/bin/env bash
# Measurements on a GPU machine, each section bounded in time, results (Markdown + JSON) under $OUT.
# Usage: scripts/gpu_report.sh SECTION...   sections: build tests gputests attention model quickmodel ours
#        fused grid profile torch ddp zero network checkpoint checkpoint7b large recompute generation
#   build      configure + build into build-gpu
#   tests      ctest (GPU suites included; the 2-rank NCCL suite needs 2 GPUs)
#   attention  bench_attention leaderboard + course sweep, and PyTorch's SDPA on the same cases
#   model      benchmark sizes small..2.7b (bf16 graph on/off, f32) and the PyTorch reference (eager, compile)
#              for TORCH_SIZES (default small,xl)
#   ddp        bench_allreduce and bench_ddp on all visible GPUs (mpirun), and PyTorch/NCCL all-reduce
#   gputests   only the GPU-labelled tests (CUDA ops, flash attention, NCCL suites, resume on CUDA)
#   ours       the step benchmark's acceptance table (all sizes, bf16 with f32 and bf16 gradients, f32;
#              context 256, graph on, AdamW after backward and fused into it)
#   fused      the bf16 step with AdamW fused into backward (--mode step-fused), and an SM-margin sweep
#   grid       the course grid: sizes x contexts, warm-up x graph x attention, 2.7b peak memory
#   zero       (2+ GPUs) train's step, xl at ctx 1024 batch 8 per rank: bucketed DDP, ZeRO-2 and ZeRO-3
#   network    (2+ GPUs) train's step at small, every stage, NCCL forced onto its network transport (as
#              between hosts)
#   checkpoint (2+ GPUs) xl checkpoint write (from ZeRO-3 shards) and load times; checkpoint7b: the same
#              for 7b (81 GB)
#   large      (2+ GPUs) the 7b preset with ZeRO-3 and recomputation at ctx 2048 (memory, MFU), also with
#              only 10, 4 and 0 of its 32 blocks recomputed whole (the others selectively)
#   recompute  recomputation's memory and time at ctx 4096 for small..xl, none, selective and block (on
#              the last GPU)
#   generation `generate` against transformers' generate at small and xl, batch 1 and 16
#              (scripts/generate_speed.sh), on SentencePiece data made from a generated corpus
#   profile    per-kernel GPU time of one bf16 train step at the course configuration, ours (ncu) and
#              torch.compile's (torch.profiler): scripts/kernel_table.sh; PROFILE_SIZE (default 2.7b)
#   torch      the PyTorch reference (eager f32, torch.compile bf16), one process per size and variant;
#              TORCH_SIZES (default small,medium,large; then xl,2.7b in another call) / TORCH_VARIANTS
#              choose, TORCH_ADAMW=default times torch.optim.AdamW's foreach
#              implementation instead of fused=True (what docs/baselines.md's figures used); run after `ours`
#              (same OUT) and it ends with the side-by-side table (scripts/step_table.py)
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu-results}
mkdir -p "$out"
scratch=${SCRATCH:-/tmp/tinytrain-gpu}  # token files and run folders: too large to keep with the results
mkdir -p "$scratch"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
export TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
sections=(build tests gputests attention model quickmodel ours fused grid profile torch ddp zero network checkpoint
  checkpoint7b large recompute generation)
[ $# -gt 0 ] || { echo "usage: scripts/gpu_report.sh SECTION... (sections: ${sections[*]})" >&2; exit 2; }
for s in "$@"; do  # all checked before the first section runs
  [[ " ${sections[*]} " == *" $s "* ]] || { echo "gpu_report.sh: unknown section '$s' (sections: ${sections[*]})" >&2; exit 2; }
done
command -v nvidia-smi >/dev/null || { echo "gpu_report.sh: no nvidia-smi: run it on a GPU machine" >&2; exit 1; }
gpus=$(nvidia-smi -L | wc -l)
b=build-gpu/apps
# Each section starts with the GPUs' state: a card held back by heat or power gives figures of no use.
section() {
  echo; echo "=== $1 ($(date +%T))"
  nvidia-smi --query-gpu=index,temperature.gpu,clocks.sm,power.draw,clocks_event_reasons.active --format=csv,noheader |
    sed "s/^/gpu /"
}
for s in "$@"; do
  [ "$s" = build ] || [ -x $b/benchmark ] ||
    { echo "gpu_report.sh $s: no $b/benchmark: run the build section first" >&2; exit 1; }
  case "$s" in
    build)
      section build
      prefix=()
      [ -d .deps/usr ] && prefix=(-DCMAKE_PREFIX_PATH="$PWD/.deps/usr")
      cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release "${prefix[@]}" >"$out/configure.log" 2>&1 || { tail -20 "$out/configure.log"; exit 1; }
      cmake --build build-gpu -j "$(nproc)" >"$out/build.log" 2>&1 || { grep -E "error" -A3 "$out/build.log" | head -40; exit 1; }
      echo "build ok" ;;
    tests)
      section tests
      timeout 300 ctest --test-dir build-gpu --output-on-failure -j 2 >"$out/ctest.log" 2>&1
      grep -E "Test +#|tests passed|Failed|Skipped" "$out/ctest.log" | tail -20
      grep -E "test cases|assertions" "$out/ctest.log" | tail -12 ;;
    gputests)
      section gputests
      timeout 240 ctest --test-dir build-gpu --output-on-failure -L gpu >"$out/ctest_gpu.log" 2>&1
      grep -E "Test +#|tests passed|Failed|Skipped" "$out/ctest_gpu.log" | tail -8
      grep -E "test cases|assertions" "$out/ctest_gpu.log" | tail -6 ;;
    attention)
      section attention
      timeout 120 $b/bench_attention --suite leaderboard --steps 50 --json "$out/attn_leaderboard.jsonl" 2>/dev/null | tee "$out/attn_leaderboard.md" | tail -4
      timeout 90 python3 apps/python/attention_baseline.py --suite leaderboard --iters 50 2>&1 | tail -4
      timeout 150 $b/bench_attention --suite course --steps 20 --warmup-iters 3 --precision bf16 --json "$out/attn_course.jsonl" >"$out/attn_course.md" 2>/dev/null
      tail -42 "$out/attn_course.md" ;;
    model)
      section model
      timeout 240 $b/benchmark --sizes small,medium,large,xl,2.7b --ctx 256 --batch 4 --precision bf16 --graph both \
        --json "$out/model_bf16.jsonl" 2>/dev/null | tee "$out/model_bf16.md" | tail -11
      timeout 150 $b/benchmark --sizes small,medium,large,xl,2.7b --ctx 256 --batch 4 --precision f32 --graph on \
        --json "$out/model_f32.jsonl" 2>/dev/null | tee "$out/model_f32.md" | tail -6
      # The reference for two sizes only (one cold torch.compile per size and variant process); the `torch`
      # section covers the rest over several calls.
      timeout 300 python3 apps/python/model_baseline.py --sizes "${TORCH_SIZES:-small,xl}" --ctx 256 \
        --variants eager-f32,compile-bf16 --json "$out/torch_model.jsonl" 2>&1 | tee "$out/torch_model.md" | tail -12 ;;
    ddp)
      section ddp
      np=$gpus
      mpi=(mpirun --allow-run-as-root -np "$np" --bind-to none -x NCCL_NVLS_ENABLE=0 -x PATH -x LD_LIBRARY_PATH)
      ce=library; [ "$np" -eq 2 ] && ce=library,copy-engine  # auto's choice for two GPUs of one host
      timeout 120 "${mpi[@]}" $b/bench_allreduce --sizes-mb 1,10,100,1000 --all-reduce "$ce" \
        --json "$out/allreduce.jsonl" 2>&1 | tee "$out/allreduce.md" | tail -12
      # NCCL against the copy-engine all-reduce under xl's backward (20 timed steps each).
      timeout 200 "${mpi[@]}" $b/bench_ddp --preset xl --precision bf16 --ctx 512 --batch 4 --strategy bucketed \
        --bucket-mb 25,100 --steps 20 --all-reduce "$ce" --json "$out/ddp_xl_transports.jsonl" 2>/dev/null |
        tee "$out/ddp_xl_transports.md" | grep -E "^\| xl" | head -6
      timeout 120 python3 -m torch.distributed.run --nproc_per_node "$np" apps/python/allreduce_baseline.py 2>&1 | tail -8
      # Every strategy with bf16 gradient buffers (the single-GPU row too), both transports; about 2 minutes.
      timeout 330 "${mpi[@]}" $b/bench_ddp --preset xl --precision bf16 --ctx 512 --batch 4 --grad-dtype bf16 \
        --strategy naive,flat,overlap,bucketed --bucket-mb 1,10,25,100,1000 --steps 20 --all-reduce "$ce" \
        --json "$out/ddp_xl_bf16grads.jsonl" 2>/dev/null | tee "$out/ddp_xl_bf16grads.md" | grep -E "^\| xl \|" | head -17
      # Every strategy, ZeRO-1 both ways, and each communicating row again with matmuls planned for 16 fewer
      # SMs (room for NCCL's kernels). About 4 minutes: each xl row builds, warms up and times 13 steps.
      timeout 330 "${mpi[@]}" $b/bench_ddp --preset xl --precision bf16 --ctx 512 --batch 4 --zero 1 \
        --strategy naive,flat,overlap,bucketed --bucket-mb 1,10,25,100,1000 --gemm-sm-margin 0,16 \
        --json "$out/ddp_xl.jsonl" 2>"$out/ddp_xl.err" | tee "$out/ddp_xl.md" | grep -E "^\| xl" | head -30
      # Gradients communicated in bf16 (half the bytes), and NCCL's CTA policy for overlap; ~2 minutes each.
      timeout 200 "${mpi[@]}" $b/bench_ddp --preset xl --precision bf16 --ctx 512 --batch 4 --zero 1 \
        --strategy bucketed --bucket-mb 25,100 --grad-comm-dtype f32,bf16 --json "$out/ddp_xl_bf16.jsonl" \
        2>/dev/null | tee "$out/ddp_xl_bf16.md" | grep -E "^\| xl" | head -8
      echo "NCCL_CTA_POLICY=1:"
      timeout 180 "${mpi[@]}" -x NCCL_CTA_POLICY=1 $b/bench_ddp --preset xl --precision bf16 --ctx 512 --batch 4 \
        --strategy bucketed --bucket-mb 100 --no-single-gpu-baseline 2>/dev/null | grep -E "^\| xl" | head -1 ;;
    quickmodel)
      section quickmodel
      timeout 150 $b/benchmark --sizes small,medium,large,xl,2.7b --ctx 256 --batch 4 --precision bf16 --graph on \
        --json "$out/model_bf16.jsonl" 2>/dev/null | tee "$out/model_bf16.md" | tail -7
      timeout 60 $b/benchmark --sizes small,xl --ctx 256 --batch 4 --precision f32 --graph on \
        --json "$out/model_f32.jsonl" 2>/dev/null | tee "$out/model_f32.md" | tail -3
      timeout 400 python3 apps/python/model_baseline.py --sizes small,xl --ctx 256 --variants eager-f32,compile-bf16 \
        --json "$out/torch_model.jsonl" 2>&1 | tee "$out/torch_model.md" | tail -6 ;;
    ours)
      # The acceptance table of the step benchmark: all sizes, bf16 (f32 and bf16 gradients) and f32, context
      # 256, graph on, AdamW after backward and fused into it. About 6 minutes.
      section ours
      timeout 450 $b/benchmark --sizes small,medium,large,xl,2.7b --ctx 256 --batch 4 --precision bf16,f32 \
        --mode step,step-fused --grad-dtype f32,bf16 --graph on --json "$out/ours_all.jsonl" 2>/dev/null |
        tee "$out/ours_all.md" | tail -31 ;;
    fused)
      # The bf16 step with AdamW fused into backward (updates overlap the rest of backward), then with
      # matmuls leaving SMs to the updates' side stream.
      section fused
      timeout 150 $b/benchmark --sizes small,medium,large,xl,2.7b --ctx 256 --batch 4 --precision bf16 \
        --mode step,step-fused --graph on --json "$out/ours_fused.jsonl" 2>/dev/null | tee "$out/ours_fused.md" | tail -11
      for margin in 16 32; do
        timeout 80 $b/benchmark --sizes 2.7b --ctx 256 --batch 4 --precision bf16 --mode step-fused --graph on \
          --gemm-sm-margin $margin 2>/dev/null | grep -E "^\| 2.7b " | sed "s/^/margin $margin: /"
      done ;;
    grid)
      # The course's experiments: sizes x contexts, warm-up 0/1/2/5 x graph x attention, 2.7b peak memory.
      section grid
      timeout 200 $b/benchmark --sizes small,medium,large,xl,2.7b --ctx 128,256,512,1024 --precision bf16 \
        --graph on --warmup-iters 2 --steps 5 --json "$out/grid_sizes.jsonl" 2>/dev/null | tee "$out/grid_sizes.md" |
        tail -22
      timeout 200 $b/benchmark --sizes small --ctx 256 --precision bf16,f32 --attention naive,flash \
        --warmup-iters 0,1,2,5 --graph both --json "$out/grid_warmup.jsonl" >"$out/grid_warmup.md" 2>/dev/null
      tail -3 "$out/grid_warmup.md"
      timeout 150 $b/benchmark --sizes 2.7b --ctx 128,256,512 --precision f32,bf16 --mode forward,step \
        --graph off --steps 3 --json "$out/grid_memory.jsonl" 2>/dev/null | tee "$out/grid_memory.md" | tail -13
      # Forward+backward with naive and with flash attention in every size.
      timeout 200 $b/benchmark --sizes small,medium,large,xl,2.7b --ctx 256 --precision bf16 --attention naive,flash \
        --mode backward --graph on --json "$out/grid_attention.jsonl" 2>/dev/null | tee "$out/grid_attention.md" | tail -11 ;;
    torch)
      section torch
      # One process per size and variant: a cold torch.compile takes 1-3 minutes per size, so a machine call
      # (10 minutes at most) covers two or three sizes: TORCH_SIZES=small,medium,large then TORCH_SIZES=xl,2.7b.
      timeout 580 python3 apps/python/model_baseline.py --sizes "${TORCH_SIZES:-small,medium,large}" \
        --ctx 256 --variants "${TORCH_VARIANTS:-eager-f32,compile-bf16}" --adamw "${TORCH_ADAMW:-fused}" \
        --json "$out/torch_all.jsonl" 2>&1 |
        tee "$out/torch_all.md" | tail -12
      # Ours next to PyTorch's, when the `ours` section ran before in the same output folder; sizes PyTorch
      # was not timed for take docs/baselines.md's figures for this GPU.
      if [ -f "$out/ours_all.jsonl" ]; then
        gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
        ref=(); case "$gpu" in *H100*) ref=(--reference h100) ;; *H200*) ref=(--reference h200) ;; esac
        python3 scripts/step_table.py "$out/ours_all.jsonl" "$out/torch_all.jsonl" "${ref[@]}" |
          tee "$out/step_table.md"
      fi ;;
    zero|network)
      # train's own median step (steps 4..12) on all GPUs. zero: xl at ctx 1024, batch 8 per rank, bucketed
      # DDP against ZeRO-2 and ZeRO-3. network: every stage at small with NCCL forced onto its network
      # transport (as between hosts).
      section "$s"
      mpi=(mpirun --allow-run-as-root -np "$gpus" --bind-to none -x NCCL_NVLS_ENABLE=0 -x PATH -x LD_LIBRARY_PATH)
      data="$scratch/random_50257"
      python3 scripts/random_tokens.py "$data" 50257
      zero_row() {  # LABEL PRESET ZERO [mpirun options...]
        local label=$1 preset=$2 zero=$3
        shift 3
        local batch=8; [ "$preset" = small ] && batch=32
        timeout 120 "${mpi[@]}" "$@" $b/train --preset "$preset" --data "$data" --ctx 1024 --batch $batch \
          --precision bf16 --zero "$zero" --steps 12 --ckpt-every -1 --eval-batches 1 --sample-tokens 0 \
          --out "$scratch/run_zero" --overwrite >"$out/${s}_${label// /_}.log" 2>&1
        read -r ms mfu peak <<<"$(python3 scripts/median_step.py "$scratch/run_zero/metrics.jsonl" 4)"
        echo "| $label | $ms | $mfu | $peak |"
      }
      {
        echo "| row | median step ms | MFU | peak GiB (rank 0) |"
        echo "|---|---|---|---|"
        if [ "$s" = zero ]; then
          zero_row "xl DDP bucketed" xl 0
          zero_row "xl ZeRO-2" xl 2
          zero_row "xl ZeRO-3" xl 3
        else
          for z in 0 1 2 3; do
            zero_row "small stage $z, network transport" small $z -x NCCL_P2P_DISABLE=1 -x NCCL_SHM_DISABLE=1
          done
        fi
      } | tee "$out/$s-train.md" ;;
    checkpoint|checkpoint7b)
      # One checkpoint written (gathered one parameter at a time from ZeRO-3 shards on all GPUs, then
      # verified by reading it back) and loaded by a resumed run: xl, or 7b (81 GB; about 6 minutes on 2 x H200).
      section "$s"
      mpi=(mpirun --allow-run-as-root -np "$gpus" --bind-to none -x NCCL_NVLS_ENABLE=0 -x PATH -x LD_LIBRARY_PATH)
      preset=xl vocab=50257 extra=()
      [ "$s" = checkpoint7b ] && preset=7b vocab=32000 extra=(--recompute block)
      data="$scratch/random_$vocab"
      python3 scripts/random_tokens.py "$data" $vocab
      df -h "$scratch" | tail -1
      # The disk's own write rate with the data forced out, for comparison with the checkpoint's.
      dd if=/dev/zero of="$scratch/dd_test" bs=64M count=64 conv=fsync 2>&1 | tail -1
      rm -f "$scratch/dd_test"
      common=(--preset $preset --data "$data" --ctx 1024 --batch 2 --precision bf16 --zero 3 "${extra[@]}"
        --eval-batches 1 --sample-tokens 0 --out "$scratch/run_ckpt")
      # Each run is killed once it has printed its line: the start point's (step 0) write and verification,
      # then the resumed run's load. SIGKILL to the ranks, because a polite stop writes one more checkpoint
      # (81 GB for 7b) before it exits.
      run_until() {  # PATTERN SECONDS TRAIN_ARGS...
        local pattern=$1 limit=$2
        shift 2
        "${mpi[@]}" $b/train "${common[@]}" "$@" >>"$out/$s.log" 2>&1 &
        local pid=$! i
        for ((i = 0; i < limit; i++)); do
          grep -qE "$pattern" "$out/$s.log" && break
          kill -0 $pid 2>/dev/null || break
          sleep 1
        done
        pkill -9 -P $pid 2>/dev/null  # the ranks: mpirun's children
        kill -9 $pid 2>/dev/null
        wait $pid 2>/dev/null
        grep -E "$pattern|error" "$out/$s.log" | tail -1
      }
      : >"$out/$s.log"
      run_until "^checkpoint .*verified" 420 --steps 1 --ckpt-every 0 --overwrite
      run_until "^resumed" 250 --steps 2 --resume latest
      rm -rf "$scratch/run_ckpt" ;;
    large)
      section large
      mpi=(mpirun --allow-run-as-root -np "$gpus" --bind-to none -x NCCL_NVLS_ENABLE=0 -x PATH -x LD_LIBRARY_PATH)
      data="$scratch/random_32000"
      python3 scripts/random_tokens.py "$data" 32000
      for batch in 4 2; do  # the larger batch when it fits
        timeout 170 "${mpi[@]}" $b/train --preset 7b --data "$data" --ctx 2048 --batch "$batch" --precision bf16 \
          --zero 3 --recompute block --steps 6 --log-every 1 --ckpt-every -1 --eval-batches 1 --sample-tokens 0 \
          --out "$scratch/run_7b_b$batch" --overwrite 2>&1 | tee "$out/train_7b_b$batch.log" | grep -E "^(step|error)|ranks"
        grep -q "^step *6/" "$out/train_7b_b$batch.log" &&
          echo "7b batch $batch per rank: median step ms, MFU, peak GiB: $(python3 scripts/median_step.py "$scratch/run_7b_b$batch/metrics.jsonl" 2)" &&
          break
      done
      # LIMIT_MIB: leave each GPU only that much (81079: an H100 80GB's, as CUDA counts it), a process holding
      # the rest.
      ballast=""
      if [ -n "${LIMIT_MIB:-}" ]; then
        python3 -c "
import time, torch
held = [torch.empty(torch.cuda.mem_get_info(d)[1] - $LIMIT_MIB * 2**20, dtype=torch.uint8, device=d)
        for d in range(torch.cuda.device_count())]
time.sleep(3600)" &
        ballast=$!
        sleep 20
        nvidia-smi --query-gpu=index,memory.used,memory.total --format=csv,noheader | sed "s/^/held by another process: /"
      fi
      # Fewer blocks recomputed whole (the others selectively), while the memory lasts: less extra forward
      # work. nvidia-smi's memory.used, sampled, is what the whole process holds: it must stay under 81079
      # MiB (what CUDA counts on an H100 80GB) for two H100s to suffice.
      for blocks in 10 4 0; do  # 0: every block selectively
        nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits -lms 500 >"$out/smi_7b_rb$blocks.csv" &
        smi=$!
        recompute=(--recompute block --recompute-blocks "$blocks")
        [ "$blocks" = 0 ] && recompute=(--recompute selective)
        timeout 170 "${mpi[@]}" $b/train --preset 7b --data "$data" --ctx 2048 --batch 4 --precision bf16 \
          --zero 3 "${recompute[@]}" --steps 10 --log-every 1 --ckpt-every -1 \
          --eval-batches 1 --sample-tokens 0 --out "$scratch/run_7b_rb$blocks" --overwrite >"$out/train_7b_rb$blocks.log" 2>&1
        kill $smi
        grep -q "^step *10/" "$out/train_7b_rb$blocks.log" || { echo "7b, $blocks of 32 blocks recomputed: $(grep -m1 -i error "$out/train_7b_rb$blocks.log")"; break; }
        echo "7b batch 4, $blocks of 32 blocks recomputed whole, the rest selectively: median step ms, MFU, peak GiB:" \
          "$(python3 scripts/median_step.py "$scratch/run_7b_rb$blocks/metrics.jsonl" 2);" \
          "nvidia-smi at most $(sort -t, -k2 -n "$out/smi_7b_rb$blocks.csv" | tail -1 | cut -d, -f2) MiB" \
          "${ballast:+(the held memory included)}"
      done
      [ -n "$ballast" ] && kill "$ballast"
      ;;
    recompute)
      section recompute
      echo "ctx 4096, batch 2, on the last GPU (so another job can use the first):"
      for size in small medium large xl; do
        for r in none selective block; do
          CUDA_VISIBLE_DEVICES=$((gpus - 1)) \
            timeout 70 $b/benchmark --sizes $size --ctx 4096 --batch 2 --vocab 50257 --precision bf16 --mode train \
            --recompute $r --warmup-iters 2 --steps 5 --json "$out/recompute_${size}_$r.jsonl" 2>/dev/null |
            grep -E "^\| $size" | sed "s/^/recompute $r: /"
        done
      done | tee "$out/recompute.md" ;;
    generation)
      section generation
      data="$scratch/sp_8000"
      if [ ! -f "$data/tokenizer.model" ]; then
        # Words of random letters: enough distinct pieces for an 8000-piece vocabulary.
        python3 -c "
import random
rng = random.Random(0)
words = [''.join(rng.choice('abcdefghijklmnopqrstuvwxyz') for _ in range(rng.randint(2, 9))) for _ in range(20000)]
with open('$scratch/corpus.txt', 'w') as f:
    for _ in range(20000):
        f.write(' '.join(rng.choice(words) for _ in range(rng.randint(20, 80))) + '\\n%\\n')
"
        build-gpu/apps/prepare_data --input "$scratch/corpus.txt" --out "$data" --separator % \
          --tokenizer sentencepiece --vocab 8000 >"$out/prepare_data.log" 2>&1 || { tail -3 "$out/prepare_data.log"; exit 1; }
      fi
      timeout 560 scripts/generate_speed.sh build-gpu "$data" "$scratch/generation" small xl 2>&1 | tail -8
      cp "$scratch/generation/generate_speed.md" "$out/" ;;
    profile)
      section profile
      size=${PROFILE_SIZE:-2.7b}
      timeout 600 scripts/kernel_table.sh build-gpu "$out" "$size:4:256:10000" | cut -c1-160 ;;
    *) echo "unknown section $s"; exit 1 ;;
  esac
done
