#!/usr/bin/env python3
"""train's metrics.jsonl summarised from a step on: median step ms, median MFU (%), peak GiB, printed
space-separated. With `gap`: the median time per step the GPU waited for the host (step_ms - gpu_ms, CUDA
runs only), in ms.

Usage: scripts/median_step.py RUN/metrics.jsonl FIRST_STEP [gap]
"""
import json
import statistics
import sys

if len(sys.argv) < 3 or not sys.argv[2].isdigit() or int(sys.argv[2]) < 1 or sys.argv[3:] not in ([], ["gap"]):
    sys.exit("usage: scripts/median_step.py RUN/metrics.jsonl FIRST_STEP [gap]   (FIRST_STEP from 1)")
try:
    rows = [json.loads(line) for line in open(sys.argv[1]) if '"step_ms"' in line]
except OSError as e:
    sys.exit(f"error: cannot read {sys.argv[1]}: {e.strerror}")
first = int(sys.argv[2])
if len(rows) < first:
    sys.exit(f"error: {sys.argv[1]} has {len(rows)} steps, none from step {first} on")
rows = rows[first - 1:]
if sys.argv[3:] == ["gap"]:
    gaps = [r["step_ms"] - r["gpu_ms"] for r in rows if "gpu_ms" in r]
    print(f"{statistics.median(gaps):.2f}" if gaps else "-")
else:
    mfus = [r["mfu"] for r in rows if r.get("mfu") is not None]  # null where the device's peak is unknown
    mfu = f"{statistics.median(mfus) * 100:.1f}%" if mfus else "-"
    peaks = [r["peak_mib"] for r in rows if "peak_mib" in r]  # CUDA runs only
    peak = f"{max(peaks) / 1024:.1f}" if peaks else "-"
    print(f"{statistics.median(r['step_ms'] for r in rows):.1f} {mfu} {peak}")
