#!/usr/bin/env bash
# `train`'s own step time (bf16; GPT-2 shapes by default: vocabulary 50257, context 1024) against the PyTorch
# reference model trained the same way (bf16 autocast, SDPA, fused AdamW, clip_grad_norm 1.0; torch.compile
# and eager), measured in one run on one GPU. Tokens are uniform random ids (the step's time does not depend
# on them).
#   scripts/train_speed.sh BUILD_DIR OUT_DIR [SIZE:BATCH[:CTX[:VOCAB]] ...]      (default: small:32 xl:8)
# e.g. 2.7b:4:256:10000 is the course configuration.
# Writes OUT_DIR/train_speed.md (the table) and the raw logs beside it.
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: scripts/train_speed.sh BUILD_DIR OUT_DIR [SIZE:BATCH[:CTX[:VOCAB]] ...]" >&2; exit 2; }
build=$1 out=$2
shift 2
[ -x "$build/apps/train" ] && [ -x "$build/apps/benchmark" ] || { echo "no train and benchmark in $build/apps: build first" >&2; exit 1; }
command -v nvidia-smi >/dev/null || { echo "no nvidia-smi: this measures a GPU, run it on a GPU machine" >&2; exit 1; }
here=$(cd "$(dirname "$0")" && pwd)  # the helper scripts, from any working folder
cases=("$@")
[ ${#cases[@]} -gt 0 ] || cases=(small:32 xl:8)
steps=${STEPS:-30}
baselines=${BASELINES-compile-bf16,sdpa-bf16}  # model_baseline.py variants; BASELINES= times `train` alone
mkdir -p "$out"
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
table="$out/train_speed.md"
{
  echo "GPU: $gpu; $(date -u +%Y-%m-%d); bf16, clip 1.0; train: median of steps 6..$steps"
  echo
  echo "| model | batch | ctx | vocab | train ms | GPU waits for host ms | tokens/s | MFU | peak GiB | benchmark ms | torch.compile ms | eager (SDPA) ms | vs compile |"
  echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
} >"$table"
# A case that fails (bad shape, out of memory) gets a row saying why, and the others still run.
failed_row() {
  local why=${1//|/\\|}
  echo "| $size | $batch | $ctx | $vocab | failed: $why | - | - | - | - | - | - | - | - |" | tee -a "$table"
}
for case in "${cases[@]}"; do
  IFS=: read -r size batch ctx vocab <<<"$case"
  ctx=${ctx:-1024} vocab=${vocab:-50257}
  data="$out/random_$vocab"
  if ! python3 "$here/random_tokens.py" "$data" "$vocab" 2>"$out/random_tokens.log"; then
    failed_row "$(tail -1 "$out/random_tokens.log")"
    continue
  fi
  tag="${size}_${batch}_${ctx}_$vocab"
  run="$out/run_$tag"
  rm -rf "$run"  # a run that fails early must not leave an earlier run's metrics to be read as its own
  "$build/apps/train" --preset "$size" --data "$data" --device cuda --ctx "$ctx" --batch "$batch" --precision bf16 \
    --steps "$steps" --eval-every 0 --eval-batches 1 --ckpt-every -1 --sample-tokens 0 --log-every 10 \
    --out "$run" --overwrite 2>&1 | tee "$out/train_$tag.log" | grep -E "^(step|error)" || true
  if ! stats=$(python3 "$here/median_step.py" "$run/metrics.jsonl" 6 2>/dev/null); then
    failed_row "$(grep -m1 '^error' "$out/train_$tag.log" || echo "see train_$tag.log")"
    continue
  fi
  read -r ms mfu peak <<<"$stats"
  gap=$(python3 "$here/median_step.py" "$run/metrics.jsonl" 6 gap)
  tok=$(python3 -c "print(round($batch * $ctx / $ms * 1e3))")
  # benchmark's train row: the same step, timed by the benchmark app (should agree with train within 3%).
  "$build/apps/benchmark" --sizes "$size" --device cuda --ctx "$ctx" --batch "$batch" --vocab "$vocab" \
    --precision bf16 --mode train --clip 1.0 --warmup-iters 5 --steps 15 --json "$out/bench_$tag.jsonl" \
    >"$out/bench_$tag.md" 2>&1 || true
  bench=$(python3 -c "import json,sys; print(f\"{json.loads(open(sys.argv[1]).readline())['step_ms']:.1f}\")" \
    "$out/bench_$tag.jsonl" 2>/dev/null || echo -)
  # Ours first, on its own line: a call cut short during PyTorch's cold compile still shows it.
  echo "$size b$batch: train $ms ms (GPU waits $gap ms for the host), $mfu MFU, $peak GiB; benchmark $bench ms"
  [ -n "$baselines" ] && PYTHONUNBUFFERED=1 timeout 400 python3 "$here/../apps/python/model_baseline.py" --sizes "$size" --ctx "$ctx" --batch "$batch" \
    --vocab "$vocab" --variants "$baselines" --clip 1.0 --warmup 5 --steps 15 \
    --json "$out/torch_$tag.jsonl" 2>&1 | tee "$out/torch_$tag.md" | grep "^|" | tail -2 || true
  read -r compile eager <<<"$(python3 - "$out/torch_$tag.jsonl" <<'PY'
import json, sys
r = {j["variant"]: j for j in map(json.loads, open(sys.argv[1]))}
f = lambda v: f"{r[v]['step_ms']:.1f}" if v in r and "step_ms" in r[v] else "-"
print(f("compile-bf16"), f("sdpa-bf16"))
PY
)"
  ratio=$(python3 -c "print(f'{$compile / $ms:.2f}x')" 2>/dev/null || echo -)
  echo "| $size | $batch | $ctx | $vocab | $ms | $gap | $tok | $mfu | $peak | $bench | $compile | $eager | $ratio |" | tee -a "$table"
done
cat "$table"
