#!/usr/bin/env bash
# On two GPUs of one host: `train` under mpirun with the gradient all-reduce carried by NCCL and by the copy
# engines gives the same losses bit for bit (both add the two ranks' gradients once, a + b, then halve), with
# f32 and with bf16 gradient buffers, and --all-reduce auto chooses the copy engines there. The step replayed
# as a CUDA graph gives the losses and gradient norms of the step launched kernel by kernel, bit for bit, with
# evaluations and checkpoints between steps: DDP over NCCL with two micro-batches (also resumed from a graph
# run's checkpoint), ZeRO-1 and ZeRO-3 with two micro-batches, ZeRO-2 in bf16 and in f32. ZeRO-3 (with the
# graph) and ZeRO-1 runs resumed from a checkpoint the ranks read together repeat the uninterrupted ones.
# Skipped (77) with fewer than two GPUs. Usage: train_transports_gpu.sh mpiexec train prepare_data
set -euo pipefail
mpiexec=$1 train=$2 prepare=$3
gpus=$(nvidia-smi -L 2>/dev/null | wc -l || true)
[ "${gpus:-0}" -ge 2 ] || { echo "needs 2 GPUs: skipped"; exit 77; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/text"
for i in $(seq 1 400); do echo "Line $i: the five boxing wizards jump quickly over $((i * 7)) fences."; echo "%"; done >"$work/text/a.txt"
"$prepare" --input "$work/text" --out "$work/data" --separator % >/dev/null
run() {  # run NAME TRANSPORT [extra train flags]
  local name=$1 transport=$2
  shift 2
  "$mpiexec" -np 2 --oversubscribe --allow-run-as-root --bind-to none -x NCCL_NVLS_ENABLE=0 \
    "$train" --data "$work/data" --device cuda --deterministic --precision bf16 --ctx 64 --batch 4 --steps 8 \
    --eval-every 4 --eval-batches 2 --sample-tokens 0 --ckpt-every 0 --warmup 2 --bucket-mb 0.01 \
    --all-reduce "$transport" --out "$work/$name" "$@" >"$work/$name.log"
}
# f32 gradient buffers (bf16 ones are the default with --precision bf16).
for transport in library copy-engine auto; do run "$transport" "$transport" --grad-dtype f32; done
# bf16 gradient buffers: both transports average bf16 gradients the same way (a + b in f32, halved, rounded).
for transport in library copy-engine; do run "$transport-bf16" "$transport" --grad-dtype bf16; done
# Two GPUs of one host with peer access: auto picks the copy engines, and says so.
grep -q "all-reduce by copy-engine" "$work/auto.log" || { grep "data parallel" "$work/auto.log"; exit 1; }
python3 - "$work/library/metrics.jsonl" "$work/copy-engine/metrics.jsonl" "$work/auto/metrics.jsonl" <<'PY'
import json, sys
runs = [[(r["step"], r["loss"], r.get("val_loss")) for r in map(json.loads, open(p))] for p in sys.argv[1:]]
assert len(runs[0]) > 0 and runs[0] == runs[1] == runs[2], runs
print("NCCL and copy-engine all-reduce train identically:", [x[1] for x in runs[0]])
PY
python3 - "$work/library-bf16/metrics.jsonl" "$work/copy-engine-bf16/metrics.jsonl" "$work/library/metrics.jsonl" <<'PY'
import json, sys
runs = [[(r["step"], r["loss"], r.get("val_loss")) for r in map(json.loads, open(p))] for p in sys.argv[1:]]
assert len(runs[0]) > 0 and runs[0] == runs[1], runs
assert runs[0] != runs[2], "bf16 gradients trained exactly like f32 ones: the rounding did not happen"
print("with bf16 gradients, NCCL and copy-engine all-reduce train identically:", [x[1] for x in runs[0]])
PY
# The CUDA-graph step against the same step launched kernel by kernel (--cuda-graph off), bit for bit, with
# evaluations (every 4 steps) and checkpoints (every 3) between steps. The copy-engine all-reduce cannot be
# replayed: that run says its step is not a graph.
same_steps() {  # same_steps A B [FIRST]: equal losses, validation losses and gradient norms from step FIRST on
  python3 - "$work/$1/metrics.jsonl" "$work/$2/metrics.jsonl" "${3:-1}" <<'PY'
import json, sys
first = int(sys.argv[3])
runs = [[(r["step"], r["loss"], r.get("val_loss"), r.get("grad_norm")) for r in map(json.loads, open(p))
         if r["step"] >= first] for p in sys.argv[1:3]]
assert len(runs[0]) >= 8 - first + 1 and runs[0] == runs[1], runs
print(sys.argv[1].split("/")[-2], "and", sys.argv[2].split("/")[-2], "train identically:", [x[1] for x in runs[0]])
PY
}
graph_says() {  # graph_says RUN yes|no: whether the banner says the step is a CUDA graph
  local says=no
  grep -q "one CUDA graph" "$work/$1.log" && says=yes
  [ "$says" = "$2" ] || { echo "$1: CUDA graph $says, expected $2"; grep "^update" "$work/$1.log"; exit 1; }
}
graph_says library-bf16 yes
graph_says copy-engine-bf16 no
# DDP over NCCL, two micro-batches a step; then a run resumed from the graph run's step-3 checkpoint
# repeats its steps 4 to 8 bit for bit.
for graph in on off; do run "ddp-graph-$graph" library --grad-accum 2 --ckpt-every 3 --cuda-graph $graph; done
same_steps ddp-graph-on ddp-graph-off
run ddp-graph-resumed library --grad-accum 2 --ckpt-every 3 --resume "$work/ddp-graph-on/checkpoints/step_3.h5"
same_steps ddp-graph-on ddp-graph-resumed 4
# ZeRO: under `auto` no graph (its memory); with `on`, stages 1 and 3 with two micro-batches a step, stage 2
# with one, and stage 2 in f32 (gathering into the flat f32 buffer instead of the bf16 copy).
for zero in 1 2 3 2-f32; do
  extra=(--zero "${zero%-f32}")
  [ "$zero" != 2 ] && extra+=(--grad-accum 2)
  [ "$zero" = 2-f32 ] && extra+=(--precision f32)
  for graph in on off; do run "zero$zero-graph-$graph" library "${extra[@]}" --ckpt-every 3 --cuda-graph $graph; done
  graph_says "zero$zero-graph-on" yes
  same_steps "zero$zero-graph-on" "zero$zero-graph-off"
done
# Ranks load a checkpoint together over NCCL (each reads a share of the file and broadcasts it on the GPU):
# a ZeRO-3 and a ZeRO-1 run resumed at their step-4 checkpoint repeat the uninterrupted runs' steps 5 to 8.
# ZeRO-3 with the graph (written by a graph run, resumed into one); ZeRO-1 by default, without.
for zero in 3 1; do
  graph=auto
  [ $zero = 3 ] && graph=on
  run "zero$zero" library --zero $zero --ckpt-every 4 --cuda-graph $graph
  run "zero$zero-resumed" library --zero $zero --ckpt-every 4 --cuda-graph $graph \
    --resume "$work/zero$zero/checkpoints/step_4.h5"
  grep -q "resumed from $work/zero$zero/checkpoints/step_4.h5" "$work/zero$zero-resumed.log" ||
    { tail -3 "$work/zero$zero-resumed.log"; exit 1; }
  python3 - "$work/zero$zero/metrics.jsonl" "$work/zero$zero-resumed/metrics.jsonl" <<'PY'
import json, sys
whole, resumed = ([(r["step"], r["loss"]) for r in map(json.loads, open(p))] for p in sys.argv[1:])
tail = [x for x in whole if x[0] > 4]
assert [s for s, _ in resumed] == [s for s, _ in tail] == [5, 6, 7, 8], (whole, resumed)
for (_, a), (_, b) in zip(resumed, tail):
    assert abs(a - b) <= 1e-6 * abs(b), (sys.argv[1], a, b)
print("resumed over NCCL with the uninterrupted run's losses:", [x[1] for x in resumed])
PY
done
graph_says zero3 yes
graph_says zero1 no

