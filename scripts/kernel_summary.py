#!/usr/bin/env python3
"""Per-kernel GPU time from an Nsight Compute CSV (ncu --metrics gpu__time_duration.sum --csv): kernels grouped
by name (template arguments dropped), with calls, total ms and share, largest first.

  ncu --clock-control none --metrics gpu__time_duration.sum --csv PROGRAM ... > k.csv
  scripts/kernel_summary.py k.csv [--top 30] [--divide 2]   (--divide: per iteration when k.csv holds several)
"""
import argparse
import csv
import re
import sys
from collections import defaultdict


def short(name):
    name = re.sub(r"\(.*\)$", "", name)  # argument list
    while True:  # template argument lists, innermost first, dropped
        folded = re.sub(r"<[^<>]*>", "", name)
        if folded == name:
            return name[:90]
        name = folded


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("csv")
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--divide", type=float, default=1.0, help="divide counts and times by this (iterations)")
    a = p.parse_args()
    if not a.divide > 0:
        p.error(f"--divide must be positive, got {a.divide:g}")
    try:
        with open(a.csv, newline="") as f:
            lines = [line for line in f if line.startswith('"')]  # ncu prints its own progress lines too
    except OSError as e:
        sys.exit(f"error: cannot read {a.csv}: {e.strerror}")
    total_ns, calls = defaultdict(float), defaultdict(int)
    for row in csv.DictReader(lines):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        unit = row.get("Metric Unit", "ns")
        scales = {"ns": 1, "nsecond": 1, "us": 1e3, "usecond": 1e3, "ms": 1e6, "msecond": 1e6, "s": 1e9,
                  "second": 1e9}
        if unit not in scales:
            sys.exit(f"error: {a.csv}: unknown time unit '{unit}' for {row['Kernel Name'][:60]}")
        scale = scales[unit]
        value = float(row["Metric Value"].replace(",", ""))
        name = short(row["Kernel Name"])
        total_ns[name] += value * scale
        calls[name] += 1
    if not total_ns:
        sys.exit(f"error: no gpu__time_duration.sum rows in {a.csv}")
    grand = sum(total_ns.values())
    print(f"| kernel | calls | total ms | share |\n|---|---|---|---|")
    for name, ns in sorted(total_ns.items(), key=lambda kv: -kv[1])[: a.top]:
        print(f"| {name} | {calls[name] / a.divide:g} | {ns / 1e6 / a.divide:.3f} | {100 * ns / grand:.1f}% |")
    print(f"| all kernels | {sum(calls.values()) / a.divide:g} | {grand / 1e6 / a.divide:.3f} | 100% |")


if __name__ == "__main__":
    main()
