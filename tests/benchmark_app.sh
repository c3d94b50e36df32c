#!/usr/bin/env bash
# Runs `benchmark` on the CPU with the tiny preset and checks its JSON rows: one row per mode, the reported
# phase means add up to the step mean (within 2%), and the Markdown table is printed.
set -euo pipefail
bench=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$bench" --sizes tiny --ctx 32 --batch 2 --device cpu --warmup 1 --steps 3 --mode forward,backward,step,step-fused \
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
