#!/usr/bin/env python3
"""train's metrics.jsonl summarised from a step on: median step ms, median MFU (%), peak GiB, printed
space-separated.

Usage: scripts/median_step.py RUN/metrics.jsonl FIRST_STEP
"""
import json
import statistics
import sys

rows = [json.loads(line) for line in open(sys.argv[1]) if '"step_ms"' in line][int(sys.argv[2]) - 1:]
print(f"{statistics.median(r['step_ms'] for r in rows):.1f} {statistics.median(r['mfu'] for r in rows) * 100:.1f}% "
      f"{max(r.get('peak_mib', 0) for r in rows) / 1024:.1f}")
