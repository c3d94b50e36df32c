#!/usr/bin/env bash
# A checkpoint opens with h5py as a PyTorch state_dict would expect (names, shapes, f32), and an independent
# NumPy implementation of the reference model (apps/python/model_baseline.py's math) evaluated on those
# weights gives the same validation loss as `train --eval-only` on the same windows of val.bin (read with
# numpy, uint16).
# Usage: checkpoint_pytorch_layout.sh train prepare_data. Skipped (77) without Debian's python3-h5py.
set -euo pipefail
train=$1 prepare=$2
py=/usr/bin/python3
$py -c "import h5py, numpy" 2>/dev/null || { echo "python3-h5py missing: skipped"; exit 77; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/text"
for i in $(seq 1 300); do echo "Sphinx of black quartz, judge my vow number $i."; echo "%"; done >"$work/text/a.txt"
"$prepare" --input "$work/text" --out "$work/data" --separator % >/dev/null
"$train" --data "$work/data" --ctx 16 --batch 2 --steps 5 --eval-batches 1 --sample-tokens 0 --device cpu \
  --out "$work/run" --ckpt-every 5 >/dev/null
"$train" --eval-only --resume "$work/run/checkpoints/step_5.h5" --data "$work/data" --ctx 16 --batch 3 \
  --eval-batches 2 --json "$work/eval.json" --device cpu >/dev/null
$py - "$work/run/checkpoints/step_5.h5" "$work/data/val.bin" "$work/eval.json" <<'PY'
import json, sys
import h5py
import numpy as np

path, val_path, eval_path = sys.argv[1:4]
with h5py.File(path, "r") as f:
    sd = {name: f["model"][name][()] for name in f["model"]}
    cfg = {k: f.attrs[k] for k in ("vocab_size", "d_model", "num_layers", "num_heads", "d_ff", "rope_theta")}
    for name in sd:
        assert f["optimizer"][name]["exp_avg"].shape == sd[name].shape, name
V, d, L, H, dff = (int(cfg[k]) for k in ("vocab_size", "d_model", "num_layers", "num_heads", "d_ff"))
expected = {"token_embeddings.weight": (V, d), "ln_final.weight": (d,), "lm_head.weight": (V, d)}
for i in range(L):
    for p in ("q_proj", "k_proj", "v_proj", "output_proj"):
        expected[f"layers.{i}.attn.{p}.weight"] = (d, d)
    expected.update({f"layers.{i}.ln1.weight": (d,), f"layers.{i}.ln2.weight": (d,),
                     f"layers.{i}.ffn.w1.weight": (dff, d), f"layers.{i}.ffn.w3.weight": (dff, d),
                     f"layers.{i}.ffn.w2.weight": (d, dff)})
assert {k: v.shape for k, v in sd.items()} == expected, sorted(sd)
assert all(v.dtype == np.float32 for v in sd.values())
sd = {k: v.astype(np.float64) for k, v in sd.items()}

def rms(x, w):
    return w * x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-5)

def rope(x):  # x: (T, H, dh), interleaved pairs
    T, _, dh = x.shape
    inv = cfg["rope_theta"] ** (-np.arange(0, dh, 2) / dh)
    ang = np.arange(T)[:, None] * inv[None, :]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    x0, x1 = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2], out[..., 1::2] = x0 * c - x1 * s, x0 * s + x1 * c
    return out

def forward(ids):
    T, dh = len(ids), d // H
    x = sd["token_embeddings.weight"][ids]
    for i in range(L):
        p = f"layers.{i}."
        h = rms(x, sd[p + "ln1.weight"])
        q, k, v = (h @ sd[p + f"attn.{n}.weight"].T for n in ("q_proj", "k_proj", "v_proj"))
        q, k, v = rope(q.reshape(T, H, dh)), rope(k.reshape(T, H, dh)), v.reshape(T, H, dh)
        s = np.einsum("thd,uhd->htu", q, k) / np.sqrt(dh)
        s = np.where(np.tril(np.ones((T, T), bool))[None], s, -np.inf)
        pr = np.exp(s - s.max(-1, keepdims=True))
        pr /= pr.sum(-1, keepdims=True)
        o = np.einsum("htu,uhd->thd", pr, v).reshape(T, d)
        x = x + o @ sd[p + "attn.output_proj.weight"].T
        h = rms(x, sd[p + "ln2.weight"])
        a, b = h @ sd[p + "ffn.w1.weight"].T, h @ sd[p + "ffn.w3.weight"].T
        x = x + (a / (1 + np.exp(-a)) * b) @ sd[p + "ffn.w2.weight"].T
    return rms(x, sd["ln_final.weight"]) @ sd["lm_head.weight"].T

tokens = np.fromfile(val_path, dtype=np.uint16).astype(np.int64)
T, windows, losses = 16, 6, []
for w in range(windows):
    ids, tg = tokens[w * T:w * T + T], tokens[w * T + 1:w * T + T + 1]
    logits = forward(ids)
    m = logits.max(-1, keepdims=True)
    lse = (m + np.log(np.exp(logits - m).sum(-1, keepdims=True)))[:, 0]
    losses.append((lse - logits[np.arange(T), tg]).mean())
ours = json.load(open(eval_path))["loss"]
ref = float(np.mean(losses))
print(f"train --eval-only: {ours:.6f}  independent NumPy model: {ref:.6f}")
assert abs(ours - ref) < 1e-4 * max(1.0, abs(ref)), (ours, ref)
PY
