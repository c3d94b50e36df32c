#!/usr/bin/env bash
# Runs `benchmark` on the CPU with the tiny preset and checks its JSON rows: one row per mode, the reported
# phase means add up to the step mean (within 2%), and the Markdown table is printed; then --memory-timeline's
# three files, the memory_viz snapshot replayed against the recorded events.
set -euo pipefail
bench=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")  # absolute: one run below starts in another folder
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$bench" --sizes tiny --ctx 32 --batch 2 --device cpu --warmup-iters 1 --steps 3 --mode forward,backward,step,step-fused \
  --json "$work/rows.jsonl" >"$work/table.md"
grep -q "| tiny | 32 | f32 | naive | step | off | 1 |" "$work/table.md"
python3 - "$work/rows.jsonl" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
assert [r["mode"] for r in rows] == ["forward", "backward", "step", "step-fused"], rows
for r in rows:
    phases = sum(r.get(k, 0.0) for k in ("forward_ms", "backward_ms", "optimizer_ms"))
    assert abs(phases - r["step_ms"]) <= 0.02 * r["step_ms"], (r["mode"], phases, r["step_ms"])
    assert r["steps"] == 3 and not r["oom"]
# step-fused runs AdamW inside backward: no optimizer phase of its own.
assert "optimizer_ms" in rows[2] and "optimizer_ms" not in rows[3], rows
print("benchmark rows ok:", [(r["mode"], round(r["step_ms"], 2)) for r in rows])
PY
# --update-in-matmul (on by default): the CPU runs the factored path too (the product, then AdamW on the CPU);
# the row says how many parameters took it: q, k, v, o, w1, w2, w3 of both layers (the output projection's
# gradient comes from the fused classifier and loss, ops::linear_cross_entropy).
"$bench" --sizes tiny --ctx 32 --batch 2 --device cpu --warmup-iters 1 --steps 2 --mode step-fused \
  --json "$work/matmul.jsonl" >/dev/null 2>"$work/err.txt"
grep -q "step-fused: 14 of 21 parameters updated inside their matmul" "$work/err.txt"
grep -q '"updated_in_matmul": 14, "parameters": 21' "$work/matmul.jsonl"
# off: every parameter on the side-stream path.
"$bench" --sizes tiny --ctx 32 --batch 2 --device cpu --warmup-iters 1 --steps 2 --mode step-fused --update-in-matmul off \
  --json "$work/matmul_off.jsonl" >/dev/null 2>"$work/err.txt"
if grep -q "updated inside their matmul" "$work/err.txt"; then
  echo "--update-in-matmul off still updated parameters inside their matmul"
  exit 1
fi
grep -q '"updated_in_matmul": 0, "parameters": 21' "$work/matmul_off.jsonl"
echo "step-fused with the update in the matmuls ok"
# --memory-timeline: the plot, the events, and a pytorch.org/memory_viz snapshot that replays to the same
# active-memory curve as the events (what the viewer's "Active Memory Timeline" draws).
(cd "$work" && "$bench" --sizes tiny --ctx 32 --batch 2 --device cpu --warmup-iters 1 --steps 1 --memory-timeline mem \
  >/dev/null 2>&1)
grep -q "<svg" "$work/mem.svg"
python3 - "$work/mem.pickle" "$work/mem.jsonl" <<'PY'
import json, pickle, sys
snap = pickle.load(open(sys.argv[1], "rb"))
events = [json.loads(line) for line in open(sys.argv[2])]
trace = snap["device_traces"][0]
assert len(trace) == len(events) > 0, (len(trace), len(events))
# Live when the trace starts: the snapshot's active blocks, and blocks the trace frees without allocating them.
allocated, freed_from_before = set(), 0
for t in trace:
    assert t["action"] in ("alloc", "free_completed") and t["size"] > 0 and t["frames"], t
    if t["action"] == "alloc":
        allocated.add(t["addr"])
    elif t["addr"] in allocated:
        allocated.remove(t["addr"])
    else:
        freed_from_before += t["size"]
live = freed_from_before + sum(
    b["size"] for s in snap["segments"] for b in s["blocks"] if b["state"] == "active_allocated")
assert live > 0
peak = 0
for t, e in zip(trace, events):
    assert t["size"] == e["bytes"] and t["action"].startswith(e["action"]), (t, e)
    live += t["size"] if t["action"] == "alloc" else -t["size"]
    assert live == e["active_bytes"], (t, e, live)
    peak = max(peak, live)
print("memory_viz snapshot ok:", len(trace), "events, peak", peak, "bytes")
PY
# A bad flag value: the error is the only output (no header before it).
if "$bench" --sizes nosuch --device cpu >"$work/out.txt" 2>&1; then echo "benchmark accepted --sizes nosuch"; exit 1; fi
[ "$(wc -l <"$work/out.txt")" -eq 1 ] && grep -q "^error: unknown preset 'nosuch'" "$work/out.txt" ||
  { echo "benchmark's error was not one line:"; cat "$work/out.txt"; exit 1; }
# A folder that does not exist: a one-line error before anything runs, and a non-zero exit.
if "$bench" --sizes tiny --device cpu --steps 1 --warmup-iters 0 --memory-timeline "$work/missing/mem" >"$work/out.txt" \
  2>"$work/err.txt"; then
  echo "benchmark accepted an unwritable --memory-timeline path"
  exit 1
fi
grep -q "cannot write --memory-timeline file '$work/missing/mem.svg'" "$work/err.txt"
if grep -q "| tiny |" "$work/out.txt"; then
  echo "benchmark measured before rejecting the --memory-timeline path"
  exit 1
fi
echo "unwritable --memory-timeline path rejected up front"
# A bad flag after --json: refused before the first row, and the earlier file keeps its rows.
cp "$work/rows.jsonl" "$work/kept.jsonl"
if "$bench" --sizes tiny --device cpu --steps 1 --json "$work/kept.jsonl" --mode fwd >/dev/null 2>"$work/err.txt"; then
  echo "benchmark accepted --mode fwd"
  exit 1
fi
grep -q "unknown --mode 'fwd'" "$work/err.txt"
cmp -s "$work/rows.jsonl" "$work/kept.jsonl" || { echo "a refused run changed the --json file"; exit 1; }
# Empty list items are refused, not skipped.
if "$bench" --sizes tiny,,small --device cpu --steps 1 >/dev/null 2>"$work/err.txt"; then
  echo "benchmark accepted --sizes tiny,,small"
  exit 1
fi
grep -q "flag --sizes has an empty item" "$work/err.txt"
# A value listed twice is refused (it would repeat a row), also when written differently.
if "$bench" --sizes tiny,small,tiny --device cpu --steps 1 >/dev/null 2>"$work/err.txt"; then
  echo "benchmark accepted --sizes tiny,small,tiny"
  exit 1
fi
grep -q "flag --sizes lists 'tiny' twice" "$work/err.txt"
if "$bench" --sizes tiny --ctx 16,016 --device cpu --steps 1 >/dev/null 2>"$work/err.txt"; then
  echo "benchmark accepted --ctx 16,016"
  exit 1
fi
grep -q "flag --ctx lists 16 twice" "$work/err.txt"
if "$bench" --sizes tiny --device cpu --steps 1 --update-in-matmul maybe >/dev/null 2>"$work/err.txt"; then
  echo "benchmark accepted --update-in-matmul maybe"
  exit 1
fi
grep -q "flag --update-in-matmul expects on/off, got 'maybe'" "$work/err.txt"
if "$bench" --sizes tiny --device cpu --steps 1 --mode step --update-in-matmul on >/dev/null 2>"$work/err.txt"; then
  echo "benchmark accepted --update-in-matmul on without a step-fused row"
  exit 1
fi
grep -q "add step-fused to --mode" "$work/err.txt"
echo "bad flags rejected up front, --json file kept"
# train rows time train's own step (apps/lib/train_step.h): one row, its step time and no phases of its own.
"$bench" --sizes tiny --ctx 32 --batch 2 --device cpu --warmup-iters 1 --steps 2 --mode train --clip 1.0 \
  --json "$work/train.jsonl" >/dev/null 2>"$work/err.txt"
python3 - "$work/train.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert len(rows) == 1 and rows[0]["mode"] == "train" and rows[0]["step_ms"] > 0, rows
assert "forward_ms" not in rows[0], rows
print("train row ok:", round(rows[0]["step_ms"], 2), "ms")
PY
# What a row got, not what was asked: train rows read the bf16 mirror whatever --bf16-weights says and warm
# up at least twice, so --warmup-iters 0,1,2 and mirror,cast come to one train row (its JSON saying so);
# the step rows keep one row each.
"$bench" --sizes tiny --ctx 32 --batch 2 --vocab 100 --device cpu --precision bf16 --warmup-iters 0,1,2 --steps 1 \
  --mode train,step --bf16-weights mirror,cast --clip 0.5 --json "$work/sweep.jsonl" >"$work/sweep.md" 2>/dev/null
python3 - "$work/sweep.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
train = [r for r in rows if r["mode"] == "train"]
assert len(train) == 1 and train[0]["warmup"] == 2 and train[0]["bf16_weights"] == "mirror", train
assert train[0]["clip"] == 0.5 and train[0]["vocab"] == 100 and train[0]["graph"] is False, train
step = [(r["warmup"], r["bf16_weights"]) for r in rows if r["mode"] == "step"]
assert step == [(w, m) for w in (0, 1, 2) for m in ("mirror", "cast")], step
assert all(r["clip"] is None for r in rows if r["mode"] == "step"), rows
print("rows say what they ran:", len(rows), "rows")
PY
[ "$(grep -c '^| tiny | 32 | bf16' "$work/sweep.md")" -eq 7 ] || { echo "table rows:"; cat "$work/sweep.md"; exit 1; }
# A clip that is not a finite number >= 0 is refused before any row.
if "$bench" --sizes tiny --device cpu --steps 1 --mode train --clip -1 >"$work/out.txt" 2>&1; then
  echo "benchmark accepted --clip -1"
  exit 1
fi
grep -q "^error: --clip must be a finite number >= 0.0, got -1$" "$work/out.txt"
# A micro-batch of more than 2^31 tokens is refused in one line (it used to allocate until killed), and a
# device name that is not one is named as the --device flag's value.
if "$bench" --sizes tiny --device cpu --steps 1 --ctx 4294967297 --batch 1 >"$work/out.txt" 2>&1; then
  echo "benchmark accepted --ctx 4294967297"
  exit 1
fi
[ "$(wc -l <"$work/out.txt")" -eq 1 ] &&
  grep -q "^error: --batch 1 x --ctx 4294967297 tokens per micro-batch is more than 2^31" "$work/out.txt" ||
  { echo "benchmark's error for --ctx 4294967297 was not the one line:"; cat "$work/out.txt"; exit 1; }
if "$bench" --sizes tiny --device gpu --steps 1 >"$work/out.txt" 2>&1; then
  echo "benchmark accepted --device gpu"
  exit 1
fi
grep -q "^error: unknown --device 'gpu' (expected auto, cpu, cuda or cuda:N)$" "$work/out.txt"
