#!/usr/bin/env python3
"""The step benchmark's comparison table: our `benchmark --json` rows next to the PyTorch reference's
`apps/python/model_baseline.py --json` rows, with speed-ups.

    scripts/step_table.py OURS.jsonl TORCH.jsonl [TORCH2.jsonl ...] [--reference h100]

bf16 rows (ours: --grad-dtype as chosen, AdamW after backward and fused into it) are compared with
torch.compile of the bf16 reference, f32 rows with eager f32. Sizes PyTorch was not measured for take
docs/baselines.md's figures when --reference names a GPU there (marked "REF"), else show "-". Speed-ups use our
step row (step-fused in parentheses)."""
import argparse
import json
import sys

# docs/baselines.md, "Model step": full step ms (f32 eager, bf16 compile), at batch 4, context 256 and
# vocabulary 10000 (REFERENCE_SHAPE).
REFERENCE_SHAPE = {"batch": 4, "ctx": 256, "vocab": 10000}
REFERENCE = {
    "h100": {
        "small": (63.0, 23.9), "medium": (113.9, 50.8), "large": (192.9, 70.0), "xl": (374.6, 112.6),
        "2.7b": (545.1, 102.7),
    },
    "h200": {"small": (None, 14.9), "xl": (None, 75.4), "2.7b": (None, 80.4)},
}
SIZES = ["tiny", "small", "medium", "large", "xl", "2.7b", "7b"]


def read_jsonl(path):
    rows = []
    try:
        f = open(path)
    except OSError as e:
        sys.exit(f"{path}: cannot read ({e.strerror})")
    with f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                sys.exit(f"{path}:{number}: not a JSON object ({e.msg})")
    return rows


def ratio(x):
    return f"{x:.3f}x" if x < 1.2 else f"{x:.2f}x"


def fmt(ms, std=None):
    if ms is None:
        return "-"
    return f"{ms:.2f} ± {std:.2f}" if std is not None else f"{ms:.2f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("ours", help="benchmark --json output")
    ap.add_argument("torch", nargs="*", help="model_baseline.py --json output(s)")
    ap.add_argument("--grad-dtype", default="bf16", choices=["f32", "bf16"],
                    help="which of our bf16 rows to use (their gradient buffer dtype)")
    ap.add_argument("--ctx", type=int, default=256, help="context length to compare")
    ap.add_argument("--reference", choices=sorted(REFERENCE), help="docs/baselines.md's figures for missing sizes")
    args = ap.parse_args()

    ours = {}  # (size, precision, mode) -> row
    for r in read_jsonl(args.ours):
        if r.get("oom") or r.get("ctx") != args.ctx or "step_ms" not in r:
            continue
        precision = "f32" if r["precision"] == "f32" else "bf16"
        if precision == "bf16" and r.get("grad_dtype") != args.grad_dtype:
            continue
        if r["mode"] not in ("step", "step-fused"):
            continue
        # Where a sweep has several rows of one kind, benchmark's defaults win: the bf16 weight mirror over
        # casts, the CUDA graph over none (rows written before these fields existed have neither).
        key = (r["size"], precision, r["mode"])
        rank = lambda row: (row.get("bf16_weights") != "cast", bool(row.get("graph")))
        if key not in ours or rank(r) >= rank(ours[key]):
            ours[key] = r
    torch = {}  # (size, variant) -> row
    for path in args.torch:
        for r in read_jsonl(path):
            if r.get("ctx") == args.ctx and r.get("step_ms") is not None:
                torch[(r["size"], r["variant"])] = r
    if not ours:
        sys.exit(f"{args.ours}: no rows of --mode step or step-fused at context {args.ctx}")

    sizes = [s for s in SIZES if any(k[0] == s for k in ours)]
    device = next(iter(ours.values())).get("device", "?")
    print(f"Full training step, context {args.ctx}, {device}; our bf16 rows with {args.grad_dtype} gradient "
          "buffers.\n")
    for precision, variant, label in (("bf16", "compile-bf16", "torch.compile bf16"),
                                      ("f32", "eager-f32", "eager f32")):
        if not any(k[1] == precision for k in ours):
            continue
        print(f"| size | ours {precision} step (ms) | step-fused (ms) | {label} (ms) | speed-up |")
        print("|---|---|---|---|---|")
        for size in sizes:
            step = ours.get((size, precision, "step"))
            fused = ours.get((size, precision, "step-fused"))
            if step is None and fused is None:
                continue
            base, base_text = None, "-"
            t = torch.get((size, variant))
            row = step or fused
            # Only a PyTorch row of the same batch and vocabulary is a comparison.
            differ = [f"{k} {t[k]}" for k in ("batch", "vocab") if t and k in t and k in row and t[k] != row[k]]
            if differ:
                base_text = f"PyTorch's row at {', '.join(differ)}: not comparable"
                t = None
            if t is not None:
                base = t["step_ms"]
                base_text = fmt(base, t.get("step_std_ms"))
            elif (args.reference and size in REFERENCE[args.reference] and
                  all(row.get(k, v) == v for k, v in REFERENCE_SHAPE.items())):
                base = REFERENCE[args.reference][size][0 if precision == "f32" else 1]
                base_text = f"{base} (REF)" if base is not None else "-"
            speed = "-"
            if base is not None:
                parts = []
                if step is not None:
                    parts.append(ratio(base / step["step_ms"]))
                if fused is not None:
                    r = ratio(base / fused["step_ms"])
                    parts.append(f"({r})" if parts else f"{r} fused")
                speed = " ".join(parts)
            print(f"| {size} | {fmt(step['step_ms'], step['step_std_ms']) if step else '-'} | "
                  f"{fmt(fused['step_ms'], fused['step_std_ms']) if fused else '-'} | {base_text} | {speed} |")
        print()


if __name__ == "__main__":
    main()
