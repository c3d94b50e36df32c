#!/usr/bin/env python3
"""The PyTorch reference Transformer LM (the CS336 "basics" model, nn/'s parameter names), timed like `benchmark`:
forward and full training step (forward + backward + AdamW), mean of --steps after --warmup, for eager f32,
bf16 autocast with fused attention (sdpa), and torch.compile of the bf16 model. One run gives the columns
that sit next to ours. Each (size, context, variant) runs in a process of its own (--in-process: all in
this one), so that no measurement starts from what an earlier one left behind: near the top of the 80 GB
card (2.7b trains at 64 GiB) torch.compile's step measured 1.5 times slower in a shared process than alone.
A measurement whose process fails becomes a row saying so. AdamW is torch.optim.AdamW(fused=True), as in
docs/baselines.md's figures (--adamw default: its multi-tensor foreach kernels, 65 ms slower at 2.7b)."""
import argparse
import json
import math
import subprocess
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

PRESETS = {
    "small": (768, 3072, 12, 12), "medium": (1024, 4096, 24, 16), "large": (1280, 5120, 36, 20),
    "xl": (1600, 6400, 48, 25), "2.7b": (2560, 10240, 32, 32), "7b": (4096, 11008, 32, 32),
    "tiny": (64, 192, 2, 4),
}


class Linear(nn.Module):
    def __init__(self, d_in, d_out):
        super().__init__()
        std = math.sqrt(2.0 / (d_in + d_out))
        self.weight = nn.Parameter(nn.init.trunc_normal_(torch.empty(d_out, d_in), std=std, a=-3 * std, b=3 * std))

    def forward(self, x):
        return x @ self.weight.t()


class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(d)), eps

    def forward(self, x):
        dtype = x.dtype
        x = x.float()
        return (self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)).to(dtype)


def rope(x, theta=10000.0):  # x: (b, h, t, d), interleaved pairs
    d, t = x.shape[-1], x.shape[-2]
    inv = theta ** (-torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d)
    ang = torch.arange(t, device=x.device, dtype=torch.float32)[:, None] * inv[None, :]
    cos, sin = ang.cos(), ang.sin()
    x0, x1 = x[..., 0::2].float(), x[..., 1::2].float()
    return torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1).flatten(-2).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, d, heads, sdpa):
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj, self.output_proj = (Linear(d, d) for _ in range(4))
        self.heads, self.sdpa = heads, sdpa

    def forward(self, x):
        b, t, d = x.shape
        split = lambda y: y.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        q, k, v = split(self.q_proj(x)), split(self.k_proj(x)), split(self.v_proj(x))
        q, k = rope(q), rope(k)
        if self.sdpa:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
            mask = torch.ones(t, t, device=x.device, dtype=torch.bool).tril()
            o = torch.softmax(s.masked_fill(~mask, float("-inf")), dim=-1) @ v
        return self.output_proj(o.transpose(1, 2).reshape(b, t, d))


class SwiGLU(nn.Module):
    def __init__(self, d, dff):
        super().__init__()
        self.w1, self.w2, self.w3 = Linear(d, dff), Linear(dff, d), Linear(d, dff)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, d, dff, heads, sdpa):
        super().__init__()
        self.attn, self.ln1, self.ln2, self.ffn = Attention(d, heads, sdpa), RMSNorm(d), RMSNorm(d), SwiGLU(d, dff)

    def forward(self, x):
        h = x + self.attn(self.ln1(x))
        return h + self.ffn(self.ln2(h))


class TransformerLM(nn.Module):
    def __init__(self, vocab, d, dff, layers, heads, sdpa):
        super().__init__()
        self.token_embeddings = nn.Embedding(vocab, d)
        nn.init.trunc_normal_(self.token_embeddings.weight, std=1.0, a=-3, b=3)
        self.layers = nn.ModuleList(Block(d, dff, heads, sdpa) for _ in range(layers))
        self.ln_final, self.lm_head = RMSNorm(d), Linear(d, vocab)

    def forward(self, ids):
        x = self.token_embeddings(ids)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.ln_final(x))


def profile_step(step, path, title):
    """One more step under torch.profiler: its kernels by GPU time, largest first, appended to `path`."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    averages = prof.key_averages()
    for key in ("self_device_time_total", "self_cuda_time_total"):  # the name moved between versions
        try:
            table = averages.table(sort_by=key, row_limit=30, max_name_column_width=90)
            break
        except (AttributeError, KeyError, ValueError):
            table = None
    with open(path, "a") as f:
        f.write(f"## {title}\n\n{table}\n")


def measure(size, ctx, batch, variant, warmup, steps, vocab, adamw="fused", profile_out="", clip=0.0):
    d, dff, layers, heads = PRESETS[size]
    bf16 = variant != "eager-f32"
    model = TransformerLM(vocab, d, dff, layers, heads, sdpa=bf16).cuda()
    # "fused": one kernel (the default here); "default": what torch.optim.AdamW picks on CUDA by itself (the
    # multi-tensor foreach kernels).
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, **({"fused": True} if adamw == "fused" else {}))
    run = torch.compile(model) if variant == "compile-bf16" else model
    ids = torch.randint(0, vocab, (batch, ctx), device="cuda")
    tgt = torch.randint(0, vocab, (batch, ctx), device="cuda")

    def loss_fn():
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            logits = run(ids)
        return F.cross_entropy(logits.float().view(-1, vocab), tgt.view(-1))

    def timed(fn):
        for _ in range(warmup):
            fn()
        torch.cuda.synchronize()
        samples = []
        for _ in range(steps):
            t0 = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            samples.append((time.perf_counter() - t0) * 1e3)
        mean = sum(samples) / len(samples)
        std = (sum((s - mean) ** 2 for s in samples) / max(1, len(samples) - 1)) ** 0.5
        return mean, std

    def forward():
        with torch.no_grad():
            loss_fn()

    def step():
        opt.zero_grad(set_to_none=True)
        loss_fn().backward()
        if clip > 0:  # as a training loop clips: the global norm, read back by the caller's logging
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()

    try:
        fwd = timed(forward)
        stp = timed(step)
        # One more step, split by CUDA events: forward + backward, then the optimizer (where a step's time goes
        # when it differs from someone else's measurement).
        torch.cuda.reset_peak_memory_stats()
        marks = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
        opt.zero_grad(set_to_none=True)
        marks[0].record()
        loss_fn().backward()
        marks[1].record()
        opt.step()
        marks[2].record()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() / 2**20
        if profile_out:
            profile_step(step, profile_out, f"{size} ctx {ctx} {variant}, AdamW {adamw}: one step")
        result = dict(forward_ms=fwd[0], forward_std_ms=fwd[1], step_ms=stp[0], step_std_ms=stp[1], peak_mib=peak,
                      fwd_bwd_ms=marks[0].elapsed_time(marks[1]), optimizer_ms=marks[1].elapsed_time(marks[2]))
        if variant == "compile-bf16":
            try:  # graphs compiled and graph breaks: a break leaves part of the model eager
                from torch._dynamo.utils import counters
                result["compiled_graphs"] = int(counters["stats"]["unique_graphs"])
                result["graph_breaks"] = int(sum(counters["graph_break"].values()))
            except Exception:  # the counters are internal and may move between versions
                pass
        return result
    except torch.OutOfMemoryError:
        return dict(oom=True)
    finally:
        del model, opt
        torch.cuda.empty_cache()


def measure_in_child(size, ctx, variant, a):
    cmd = [sys.executable, __file__, "--one", f"{size},{ctx},{variant}", "--batch", str(a.batch),
           "--vocab", str(a.vocab), "--warmup", str(a.warmup), "--steps", str(a.steps), "--adamw", a.adamw,
           "--profile-out", a.profile_out, "--clip", str(a.clip)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    lines = done.stdout.strip().splitlines()
    try:
        if done.returncode == 0 and lines:
            return json.loads(lines[-1])
    except json.JSONDecodeError:
        pass
    reason = (done.stderr.strip().splitlines() or ["no output"])[-1]
    print(f"error: measuring {size} ctx {ctx} {variant} failed (exit {done.returncode}): {reason}",
          file=sys.stderr, flush=True)
    return dict(failed=reason)


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--sizes", default="small")
    p.add_argument("--ctx", default="256")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--vocab", type=int, default=10000)
    p.add_argument("--variants", default="eager-f32,sdpa-bf16,compile-bf16",
                   help="comma-separated: eager-f32 (f32, eager), sdpa-bf16 (bf16 autocast, SDPA, eager), "
                        "compile-bf16 (the same under torch.compile)")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--json", default="")
    p.add_argument("--adamw", default="fused", choices=["default", "fused"],
                   help="torch.optim.AdamW's implementation: its default (foreach) or fused=True")
    p.add_argument("--profile-out", default="",
                   help="also profile one step per row (torch.profiler) and append its kernel table to this file")
    p.add_argument("--clip", type=float, default=0.0,
                   help="clip_grad_norm_ to this global norm in each step, as training does (0: no clipping)")
    p.add_argument("--in-process", action="store_true", help="measure everything in this one process")
    p.add_argument("--one", default="", help=argparse.SUPPRESS)  # size,ctx,variant: measure, print JSON
    a = p.parse_args()
    unknown = sorted(set(a.variants.split(",")) - {"eager-f32", "sdpa-bf16", "compile-bf16"})
    if unknown:
        p.error(f"unknown --variants {','.join(unknown)} (expected eager-f32, sdpa-bf16 or compile-bf16)")
    if a.one:
        size, ctx, variant = a.one.split(",")
        print(json.dumps(measure(size, int(ctx), a.batch, variant, a.warmup, a.steps, a.vocab, a.adamw,
                                a.profile_out, a.clip)))
        return
    out = open(a.json, "w") if a.json else None
    if a.in_process:
        device = torch.cuda.get_device_name()
    else:  # without a CUDA context of this process's own on the GPU the children measure on
        found = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.get_device_name())"],
                               capture_output=True, text=True)
        if found.returncode != 0:
            raise SystemExit("error: no CUDA device for PyTorch: " + (found.stderr.strip().splitlines() or ["?"])[-1])
        device = found.stdout.strip()
    print(f"device: {device}, torch {torch.__version__}, batch {a.batch}, vocabulary {a.vocab}, "
          f"clip {a.clip or 'off'}\n")
    print("| size | ctx | variant | forward ms | step ms | one step: fwd+bwd ms | one step: AdamW ms | peak MiB |\n"
          "|---|---|---|---|---|---|---|---|")
    for size in a.sizes.split(","):
        for ctx in map(int, a.ctx.split(",")):
            for variant in a.variants.split(","):
                if a.in_process:
                    r = measure(size, ctx, a.batch, variant, a.warmup, a.steps, a.vocab, a.adamw, a.profile_out,
                                a.clip)
                else:
                    r = measure_in_child(size, ctx, variant, a)
                r.update(size=size, ctx=ctx, variant=variant, batch=a.batch, vocab=a.vocab, adamw=a.adamw,
                         clip=a.clip)
                if r.get("failed"):
                    print(f"| {size} | {ctx} | {variant} | failed | failed | - | - | - |", flush=True)
                elif r.get("oom"):
                    print(f"| {size} | {ctx} | {variant} | OOM | OOM | - | - | - |", flush=True)
                else:
                    print(f"| {size} | {ctx} | {variant} | {r['forward_ms']:.2f} ± {r['forward_std_ms']:.2f} | "
                          f"{r['step_ms']:.2f} ± {r['step_std_ms']:.2f} | {r['fwd_bwd_ms']:.2f} | "
                          f"{r['optimizer_ms']:.2f} | {r['peak_mib']:.0f} |", flush=True)
                if out:
                    out.write(json.dumps(r) + "\n")
                    out.flush()


if __name__ == "__main__":
    main()
