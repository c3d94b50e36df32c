#!/usr/bin/env python3
"""train's metrics.jsonl summarised from a step on: median step ms, median MFU (%), peak GiB, printed
space-separated. With `gap`: the median time per step the GPU waited for the host (step_ms - gpu_ms, CUDA
runs only), in ms.

Usage: scripts/median_step.py RUN/metrics.jsonl FIRST_STEP [gap]
"""
import json
import statistics
import sys

rows = [json.loads(line) for line in open(sys.argv[1]) if '"step_ms"' in line][int(sys.argv[2]) - 1:]
if sys.argv[3:] == ["gap"]:
    gaps = [r["step_ms"] - r["gpu_ms"] for r in rows if "gpu_ms" in r]
    print(f"{statistics.median(gaps):.2f}" if gaps else "-")
else:
    print(f"{statistics.median(r['step_ms'] for r in rows):.1f} {statistics.median(r['mfu'] for r in rows) * 100:.1f}% "
          f"{max(r.get('peak_mib', 0) for r in rows) / 1024:.1f}")
