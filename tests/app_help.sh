#!/usr/bin/env bash
# Every app prints "tinytrain <version>" for --version and its flags for --help, both with exit code 0, and
# no help line is wider than 100 columns. Then the spellings of a switch (generate's --no-stop is off by
# default; benchmark's --update-in-matmul is on): --name, --no-name, --name=on|off and --name on|off.
# Usage: app_help.sh APP_DIR
set -euo pipefail
apps=$1
for app in train prepare_data generate export import benchmark bench_attention bench_allreduce bench_ddp; do
  version=$("$apps/$app" --version)
  [[ "$version" =~ ^tinytrain\ [0-9]+\.[0-9]+\.[0-9]+ ]] || { echo "$app --version printed '$version'"; exit 1; }
  help=$("$apps/$app" --help)
  grep -q "^usage: $app " <<<"$help" || { echo "$app --help has no usage line"; exit 1; }
  wide=$(awk 'length($0) > 100' <<<"$help")
  [ -z "$wide" ] || { echo "$app --help has lines over 100 columns:"; echo "$wide"; exit 1; }
done
# train's help is grouped under headings and shows the choices of fixed-choice flags.
help=$("$apps/train" --help)
for heading in model data schedule checkpoints evaluation distributed output; do
  grep -q "^$heading:" <<<"$help" || { echo "train --help has no '$heading:' heading"; exit 1; }
done
grep -q -- "--precision f32|bf16" <<<"$help" || { echo "train --help does not show --precision's choices"; exit 1; }
# The benchmarks' untimed iterations are --warmup-iters (train's --warmup is the learning-rate warm-up);
# --warmup is still accepted.
grep -q -- "--warmup-iters" <<<"$("$apps/benchmark" --help)" || { echo "benchmark has no --warmup-iters"; exit 1; }
# The contract's spellings still run: --warmup (and --preset for --sizes).
"$apps/benchmark" --preset tiny --ctx 16 --batch 1 --device cpu --warmup 0 --steps 1 --mode forward \
  --update-in-matmul off >/dev/null 2>&1
# Switch spellings: accepted ones parse (the run then fails later for want of a checkpoint, with another
# message), a bad value is one line naming the flag.
for form in "--no-stop" "--no-stop=on" "--no-stop off" "--no-no-stop"; do
  # shellcheck disable=SC2086
  if out=$("$apps/generate" $form --checkpoint /nonexistent.h5 --prompt x 2>&1); then
    echo "generate $form succeeded without a checkpoint"; exit 1
  fi
  if grep -q -- "unknown flag\|expects on/off" <<<"$out"; then echo "generate $form: $out"; exit 1; fi
done
if out=$("$apps/generate" --no-stop=maybe --checkpoint /nonexistent.h5 2>&1); then exit 1; fi
grep -q "flag --no-stop expects on/off, got 'maybe'" <<<"$out" || { echo "bad switch value: $out"; exit 1; }
echo "app help and version ok"
