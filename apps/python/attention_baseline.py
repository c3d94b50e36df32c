#!/usr/bin/env python3
"""PyTorch's scaled_dot_product_attention on the configurations of bench_attention, so one run gives both
columns. Times the FlashAttention-2 and cuDNN backends with CUDA events: forward, backward,
forward+backward, mean over the timed iterations after warm-up. Needs a CUDA GPU; run with PyTorch 2.11 (a
PyTorch without torch.nn.attention's sdpa_kernel and cuDNN backend fails at import)."""
import argparse
import json
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = {"torch-flash": SDPBackend.FLASH_ATTENTION, "torch-cudnn": SDPBackend.CUDNN_ATTENTION}


def configs(suite, max_seq):
    if suite == "leaderboard":
        return [(1, 16, 16384, 64, torch.bfloat16)], True
    if suite == "models":
        return [(b, h, 1024, 64, torch.bfloat16) for b, h in ((32, 12), (16, 16), (12, 20), (8, 25))], False
    if suite == "course":
        return [(8, 1, t, d, torch.bfloat16) for d in (16, 32, 64, 128) for t in (256, 1024, 4096, 8192, 16384)], False
    if suite == "sweep":
        out, t = [], []
        for dtype in (torch.bfloat16,):
            for d in (16, 32, 64, 128):
                seq = 128
                while seq <= max_seq:
                    out.append((1, 1, seq, d, dtype))
                    seq *= 2
        return out, False
    raise SystemExit(f"unknown suite {suite}")


def time_one(backend, b, h, t, d, dtype, ones, warmup, iters):
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.rand(b, h, t, d, device="cuda", dtype=dtype, generator=gen).mul_(2).sub_(1).requires_grad_()
               for _ in range(3))
    grad = torch.ones_like(q) if ones else torch.rand_like(q)
    start, mid, end = (torch.cuda.Event(enable_timing=True) for _ in range(3))

    def fwd():
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    for _ in range(warmup):
        fwd().backward(grad)
        q.grad = k.grad = v.grad = None
    f_ms = b_ms = 0.0
    for _ in range(iters):
        start.record()
        o = fwd()
        mid.record()
        o.backward(grad)
        end.record()
        torch.cuda.synchronize()
        f_ms += start.elapsed_time(mid)
        b_ms += mid.elapsed_time(end)
        q.grad = k.grad = v.grad = None
    start.record()
    for _ in range(iters):
        fwd().backward(grad)
        q.grad = k.grad = v.grad = None
    end.record()
    torch.cuda.synchronize()
    return f_ms / iters, b_ms / iters, start.elapsed_time(end) / iters


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--suite", default="leaderboard")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--iters", type=int, default=100)
    p.add_argument("--max-seq", type=int, default=65536)
    p.add_argument("--json", default="")
    a = p.parse_args()
    out = open(a.json, "w") if a.json else None
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}\n")
    for suite in a.suite.split(","):
        cfgs, ones = configs(suite, a.max_seq)
        print(f"## suite: {suite} (PyTorch)\n")
        print("| impl | BxHxTxd | dtype | fwd ms | bwd ms | fwd+bwd ms | fwd TFLOP/s | fwd+bwd TFLOP/s |")
        print("|---|---|---|---|---|---|---|---|")
        for b, h, t, d, dtype in cfgs:
            flops = 4.0 * b * h * t * t * d * 0.5
            for name, backend in BACKENDS.items():
                try:
                    f, bw, tot = time_one(backend, b, h, t, d, dtype, ones, a.warmup, a.iters)
                    row = dict(suite=suite, impl=name, batch=b, heads=h, seq=t, d_head=d, dtype=str(dtype).split(".")[-1],
                               forward_ms=f, backward_ms=bw, forward_backward_ms=tot,
                               forward_tflops=flops / f / 1e9, forward_backward_tflops=3.5 * flops / tot / 1e9)
                    print(f"| {name} | {b}x{h}x{t}x{d} | {row['dtype']} | {f:.3f} | {bw:.3f} | {tot:.3f} | "
                          f"{row['forward_tflops']:.1f} | {row['forward_backward_tflops']:.1f} |")
                except (RuntimeError, torch.OutOfMemoryError) as e:  # backend unsupported here, or OOM
                    row = dict(suite=suite, impl=name, batch=b, heads=h, seq=t, d_head=d, error=str(e).split("\n")[0])
                    print(f"| {name} | {b}x{h}x{t}x{d} | - | error: {row['error'][:60]} | | | | |")
                    torch.cuda.empty_cache()
                if out:
                    out.write(json.dumps(row) + "\n")
                    out.flush()
                sys.stdout.flush()
        print()


if __name__ == "__main__":
    main()
