#!/usr/bin/env bash
# Generation speed: `generate` (KV cache, greedy) against transformers' generate on the same exported model
# and GPU, at batch 1 and 16. The model is trained for one step on DATA (a prepared folder; the weights do
# not change the speed), exported with `export`, and loaded by LlamaForCausalLM in bf16.
# Both sides give the decoding rate: the new tokens after each prompt's first, over the time of the steps
# that made them. Ours is generate's own "decoding" figure (its prompts' pass is left out, and with it
# most of the process's first CUDA calls); transformers' is B x (N - 1) / (t(N) - t(1)) from warm calls
# with N and with 1 new token, the same count over the same steps. `generate` runs twice: as it does by
# default (its decoding steps replayed as a CUDA graph) and with --cuda-graph off (kernel by kernel).
#   scripts/generate_speed.sh BUILD_DIR DATA OUT_DIR [SIZE ...]      (default: small)
set -euo pipefail
[ $# -ge 3 ] || { echo "usage: scripts/generate_speed.sh BUILD_DIR DATA OUT_DIR [SIZE ...]" >&2; exit 2; }
build=$1 data=$2 out=$3
shift 3
for app in train export generate; do
  [ -x "$build/apps/$app" ] || { echo "no $app in $build/apps: build first" >&2; exit 1; }
done
command -v nvidia-smi >/dev/null || { echo "no nvidia-smi: this measures a GPU, run it on a GPU machine" >&2; exit 1; }
sizes=("$@")
[ ${#sizes[@]} -gt 0 ] || sizes=(small)
tokens=${TOKENS:-128}
[ "$tokens" -ge 2 ] 2>/dev/null || { echo "TOKENS must be a whole number >= 2, got '$tokens'" >&2; exit 2; }
[ -f "$data/meta.json" ] || { echo "$data holds no prepared dataset (meta.json): run prepare_data first" >&2; exit 1; }
mkdir -p "$out"
table="$out/generate_speed.md"
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
{
  echo "GPU: $gpu; $(date -u +%Y-%m-%d); bf16, greedy, $tokens new tokens per prompt; decoding tokens/s"
  echo
  echo "| model | batch | generate decoding tokens/s | generate --cuda-graph off | transformers decoding tokens/s |"
  echo "|---|---|---|---|---|"
} >"$table"
for size in "${sizes[@]}"; do
  run="$out/run_$size"
  "$build/apps/train" --preset "$size" --data "$data" --device cuda --ctx 1024 --batch 1 --steps 1 --eval-batches 1 \
    --ckpt-every 0 --sample-tokens 0 --precision bf16 --out "$run" --overwrite >"$out/train_$size.log" 2>&1 ||
    { echo "train failed for $size:" >&2; tail -3 "$out/train_$size.log" >&2; exit 1; }
  "$build/apps/export" --checkpoint "$run/checkpoints/step_1.h5" --out "$out/hf_$size" --overwrite >/dev/null
  for batch in 1 16; do
    for i in $(seq 1 "$batch"); do echo "Once upon a time number $i"; done >"$out/prompts.txt"
    rate() {  # generate's decoding tokens/s with the given flags
      local log="$out/generate_${size}_$batch$1.log"
      "$build/apps/generate" --checkpoint "$run/checkpoints/step_1.h5" --device cuda --precision bf16 \
        --temperature 0 --max-tokens "$tokens" --no-stop --batch "$batch" "${@:2}" <"$out/prompts.txt" >/dev/null \
        2>"$log" || { echo "generate failed for $size batch $batch:" >&2; tail -3 "$log" >&2; exit 1; }
      grep -o 'decoding [0-9.]* tokens/s' "$log" | cut -d' ' -f2
    }
    ours=$(rate "")
    kernels=$(rate _graph_off --cuda-graph off)
    theirs=$(python3 - "$out/hf_$size" "$out/prompts.txt" "$tokens" <<'PY'
import sys, time, torch
from transformers import AutoTokenizer, LlamaForCausalLM
path, prompts, n = sys.argv[1], open(sys.argv[2]).read().splitlines(), int(sys.argv[3])
model = LlamaForCausalLM.from_pretrained(path, torch_dtype=torch.bfloat16).cuda().eval()
tok = AutoTokenizer.from_pretrained(path)
tok.pad_token = tok.pad_token or tok.eos_token
tok.padding_side = "left"
batch = tok(prompts, return_tensors="pt", padding=True).to("cuda")
def seconds(new_tokens):
    kw = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, pad_token_id=tok.pad_token_id)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    model.generate(**batch, **kw)
    torch.cuda.synchronize()
    return time.perf_counter() - t0
seconds(n)  # warm-up
print(f"{len(prompts) * (n - 1) / (seconds(n) - seconds(1)):.1f}")
PY
)
    echo "| $size | $batch | ${ours:-?} | ${kernels:-?} | ${theirs:-?} |" | tee -a "$table"
  done
done
cat "$table"
