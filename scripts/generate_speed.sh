#!/usr/bin/env bash
# Generation speed: `generate` (KV cache, greedy) against transformers' generate on the same exported model
# and GPU, at batch 1 and 16. The model is trained for one step on DATA (a prepared folder; the weights do
# not change the speed), exported with `export`, and loaded by LlamaForCausalLM in bf16.
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
mkdir -p "$out"
table="$out/generate_speed.md"
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
{
  echo "GPU: $gpu; $(date -u +%Y-%m-%d); bf16, greedy, $tokens new tokens per prompt"
  echo
  echo "| model | batch | generate tokens/s | transformers tokens/s |"
  echo "|---|---|---|---|"
} >"$table"
for size in "${sizes[@]}"; do
  run="$out/run_$size"
  "$build/apps/train" --preset "$size" --data "$data" --device cuda --ctx 1024 --batch 1 --steps 1 --eval-batches 1 \
    --ckpt-every 0 --sample-tokens 0 --precision bf16 --out "$run" --overwrite >"$out/train_$size.log" 2>&1
  "$build/apps/export" --checkpoint "$run/checkpoints/step_1.h5" --out "$out/hf_$size" --overwrite >/dev/null
  for batch in 1 16; do
    for i in $(seq 1 "$batch"); do echo "Once upon a time number $i"; done >"$out/prompts.txt"
    ours=$("$build/apps/generate" --checkpoint "$run/checkpoints/step_1.h5" --device cuda --precision bf16 \
      --temperature 0 --max-tokens "$tokens" --no-stop --batch "$batch" <"$out/prompts.txt" 2>&1 >/dev/null |
      grep -o '[0-9.]* tokens/s' | tail -1 | cut -d' ' -f1)
    theirs=$(python3 - "$out/hf_$size" "$out/prompts.txt" "$tokens" <<'PY'
import sys, time, torch
from transformers import AutoTokenizer, LlamaForCausalLM
path, prompts, n = sys.argv[1], open(sys.argv[2]).read().splitlines(), int(sys.argv[3])
model = LlamaForCausalLM.from_pretrained(path, torch_dtype=torch.bfloat16).cuda().eval()
tok = AutoTokenizer.from_pretrained(path)
tok.pad_token = tok.pad_token or tok.eos_token
tok.padding_side = "left"
batch = tok(prompts, return_tensors="pt", padding=True).to("cuda")
kw = dict(max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=tok.pad_token_id)
model.generate(**batch, **kw)  # warm-up
torch.cuda.synchronize()
t0 = time.perf_counter()
model.generate(**batch, **kw)
torch.cuda.synchronize()
print(f"{len(prompts) * n / (time.perf_counter() - t0):.0f}")
PY
)
    echo "| $size | $batch | ${ours:-?} | ${theirs:-?} |" | tee -a "$table"
  done
done
cat "$table"
