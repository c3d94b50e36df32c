#!/usr/bin/env python3
"""Independent checks of `export`'s Hugging Face Llama folders, with NumPy alone (no code of the project).

  loss DIR VAL_BIN CTX BATCH BATCHES EVAL_JSON   safetensors parsed by hand, config.json read, a Llama
                                                 forward in Hugging Face's convention (rotate-half RoPE,
                                                 RMSNorm with rms_norm_eps, SwiGLU) over the windows
                                                 `train --eval-only` evaluates: the same mean loss
                                                 (relative 1e-5)
  logits DIR VAL_BIN CTX NPY [TOL]               the same forward's logits of window 0 against the .npy that
                                                 `train --eval-only --logits` wrote (parsed by hand): max
                                                 |difference| over max |logit| within TOL (1e-5)
  bf16 F32_DIR BF16_DIR                          every BF16 tensor is its F32 twin rounded to nearest even
  make DIR KEY=VALUE...                          a random Llama folder (dtype, theta, eps, vocab, d, layers,
                                                 heads, dff, ctx, shards, seed; rope=parameters: theta in
                                                 rope_parameters, as transformers 5 writes it)
  break SRC DST CASE                             a copy of SRC damaged one way (CASES below)
"""
import json
import os
import shutil
import sys

import numpy as np

DTYPES = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": np.dtype("<u2"), "I32": np.dtype("<i4")}


def read_safetensors(path):
    """{name: (dtype, shape, raw bytes)} and the metadata, checking the layout as the format defines it."""
    blob = open(path, "rb").read()
    n = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    assert (8 + n) % 8 == 0, "data not 8-byte aligned"
    data = blob[8 + n:]
    meta = header.pop("__metadata__", None)
    out, end = {}, 0
    for name, e in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"]):
        b, f = e["data_offsets"]
        assert b == end, (name, b, end)
        assert f - b == int(np.prod(e["shape"], dtype=np.int64)) * DTYPES[e["dtype"]].itemsize, name
        out[name] = (e["dtype"], list(e["shape"]), data[b:f])
        end = f
    assert end == len(data), "bytes after the last tensor"
    return out, meta


def write_safetensors(path, tensors, meta={"format": "pt"}):
    """tensors: list of (name, dtype, shape, raw bytes), written in that order."""
    header, offset = {"__metadata__": meta} if meta else {}, 0
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text)
        for _, _, _, raw in tensors:
            f.write(raw)


def to_float(dtype, shape, raw):
    a = np.frombuffer(raw, DTYPES[dtype])
    if dtype == "BF16":
        a = (a.astype(np.uint32) << 16).view(np.float32)
    return a.astype(np.float64).reshape(shape)


def bf16_round(x):
    """f32 -> bf16 bits, round to nearest even (as torch does)."""
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def read_folder(folder):
    """(config, {name: (dtype, shape, raw)}) of a single-file or sharded folder."""
    config = json.load(open(os.path.join(folder, "config.json")))
    single = os.path.join(folder, "model.safetensors")
    if os.path.exists(single):
        return config, read_safetensors(single)[0]
    index = json.load(open(os.path.join(folder, "model.safetensors.index.json")))
    tensors, total = {}, 0
    for file in sorted(set(index["weight_map"].values())):
        part, meta = read_safetensors(os.path.join(folder, file))
        assert meta == {"format": "pt"}, meta
        for name in part:
            assert index["weight_map"][name] == file, name
        tensors.update(part)
        total += sum(len(raw) for _, _, raw in part.values())
    assert sorted(tensors) == sorted(index["weight_map"]), "index and shards differ"
    assert index["metadata"]["total_size"] == total, (index["metadata"], total)
    return config, tensors


def expected_shapes(c):
    V, d, L, dff = c["vocab_size"], c["hidden_size"], c["num_hidden_layers"], c["intermediate_size"]
    shapes = {"model.embed_tokens.weight": [V, d], "model.norm.weight": [d], "lm_head.weight": [V, d]}
    for i in range(L):
        p = f"model.layers.{i}."
        for n in ("q_proj", "k_proj", "v_proj", "o_proj"):
            shapes[p + f"self_attn.{n}.weight"] = [d, d]
        shapes.update({p + "input_layernorm.weight": [d], p + "post_attention_layernorm.weight": [d],
                       p + "mlp.gate_proj.weight": [dff, d], p + "mlp.up_proj.weight": [dff, d],
                       p + "mlp.down_proj.weight": [d, dff]})
    return shapes


def llama_forward(folder):
    """The Llama forward of an export in Hugging Face's convention: a function from token ids to logits."""
    c, raw = read_folder(folder)
    assert c["architectures"] == ["LlamaForCausalLM"] and c["model_type"] == "llama", c
    assert c["tie_word_embeddings"] is False and c["num_key_value_heads"] == c["num_attention_heads"], c
    assert {k: v[1] for k, v in raw.items()} == expected_shapes(c), sorted(raw)
    dtype = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}[c["torch_dtype"]]
    assert all(v[0] == dtype for v in raw.values()), "tensor dtypes differ from torch_dtype"
    w = {k: to_float(*v) for k, v in raw.items()}
    d, H, L = c["hidden_size"], c["num_attention_heads"], c["num_hidden_layers"]
    theta = c["rope_theta"] if "rope_theta" in c else c["rope_parameters"]["rope_theta"]
    dh, eps = d // H, c["rms_norm_eps"]

    def rms(x, g):
        return g * (x / np.sqrt((x * x).mean(-1, keepdims=True) + eps))

    def rope(x):  # (T, H, dh), Hugging Face's rotate_half
        T = x.shape[0]
        inv = 1.0 / theta ** (np.arange(0, dh, 2) / dh)
        ang = np.arange(T)[:, None] * inv[None, :]
        emb = np.concatenate([ang, ang], -1)[:, None, :]
        rotated = np.concatenate([-x[..., dh // 2:], x[..., :dh // 2]], -1)
        return x * np.cos(emb) + rotated * np.sin(emb)

    def forward(ids):
        T = len(ids)
        x = w["model.embed_tokens.weight"][ids]
        mask = np.tril(np.ones((T, T), bool))[None]
        for i in range(L):
            p = f"model.layers.{i}."
            h = rms(x, w[p + "input_layernorm.weight"])
            q, k, v = (h @ w[p + f"self_attn.{n}.weight"].T for n in ("q_proj", "k_proj", "v_proj"))
            q, k, v = rope(q.reshape(T, H, dh)), rope(k.reshape(T, H, dh)), v.reshape(T, H, dh)
            s = np.where(mask, np.einsum("thd,uhd->htu", q, k) / np.sqrt(dh), -np.inf)
            pr = np.exp(s - s.max(-1, keepdims=True))
            pr /= pr.sum(-1, keepdims=True)
            x = x + np.einsum("htu,uhd->thd", pr, v).reshape(T, d) @ w[p + "self_attn.o_proj.weight"].T
            h = rms(x, w[p + "post_attention_layernorm.weight"])
            a, b = h @ w[p + "mlp.gate_proj.weight"].T, h @ w[p + "mlp.up_proj.weight"].T
            x = x + (a / (1 + np.exp(-a)) * b) @ w[p + "mlp.down_proj.weight"].T
        return rms(x, w["model.norm.weight"]) @ w["lm_head.weight"].T

    return forward


def llama_loss(folder, tokens, ctx, windows):
    forward = llama_forward(folder)
    losses = []
    for i in range(windows):
        ids, targets = tokens[i * ctx:i * ctx + ctx], tokens[i * ctx + 1:i * ctx + ctx + 1]
        logits = forward(ids)
        m = logits.max(-1, keepdims=True)
        lse = (m + np.log(np.exp(logits - m).sum(-1, keepdims=True)))[:, 0]
        losses.append((lse - logits[np.arange(ctx), targets]).mean())
    return float(np.mean(losses))


def cmd_loss(folder, val_bin, ctx, batch, batches, eval_json):
    ctx, windows = int(ctx), int(batch) * int(batches)
    tokens = np.fromfile(val_bin, dtype=np.uint16).astype(np.int64)
    ref = llama_loss(folder, tokens, ctx, windows)
    ours = json.load(open(eval_json))["loss"]
    print(f"train --eval-only: {ours:.8f}  NumPy Llama (Hugging Face convention) on {folder}: {ref:.8f}")
    assert abs(ours - ref) <= 1e-5 * abs(ref), (ours, ref)


def read_npy_f32(path):
    """A .npy file of f32 values parsed by hand (format 1.0): header dict, then the raw little-endian data."""
    raw = open(path, "rb").read()
    assert raw[:8] == b"\x93NUMPY\x01\x00", "not a version 1.0 .npy file"
    length = int.from_bytes(raw[8:10], "little")
    header = raw[10:10 + length].decode("latin1")
    assert "'descr': '<f4'" in header and "'fortran_order': False" in header, header
    shape = tuple(int(v) for v in header.split("(")[1].split(")")[0].split(",") if v.strip())
    assert (10 + length) % 64 == 0, "data not aligned to 64 bytes"
    return np.frombuffer(raw[10 + length:], dtype="<f4").reshape(shape)


def cmd_logits(folder, val_bin, ctx, logits_npy, tolerance="1e-5"):
    ctx = int(ctx)
    tokens = np.fromfile(val_bin, dtype=np.uint16).astype(np.int64)
    ref = llama_forward(folder)(tokens[:ctx])
    ours = read_npy_f32(logits_npy).astype(np.float64)
    assert ours.shape == ref.shape, (ours.shape, ref.shape)
    worst = float(np.abs(ours - ref).max() / np.abs(ref).max())
    print(f"logits of window 0: ours against NumPy Llama on {folder}: max |diff| / max |logit| = {worst:.2e}")
    assert worst <= float(tolerance), worst


def cmd_bf16(f32_dir, bf16_dir):
    _, a = read_folder(f32_dir)
    c, b = read_folder(bf16_dir)
    assert c["torch_dtype"] == "bfloat16" and sorted(a) == sorted(b)
    for name in a:
        assert b[name][0] == "BF16" and b[name][1] == a[name][1], name
        want = bf16_round(np.frombuffer(a[name][2], "<f4"))
        assert np.array_equal(np.frombuffer(b[name][2], "<u2"), want), name
    print(f"{bf16_dir}: every tensor is {f32_dir}'s rounded to bf16")


def cmd_make(folder, *pairs):
    o = {"dtype": "F32", "theta": "10000.0", "eps": "1e-5", "vocab": "257", "d": "32", "layers": "2",
         "heads": "4", "dff": "48", "ctx": "16", "shards": "1", "seed": "0", "rope": "theta"}
    for pair in pairs:
        key, value = pair.split("=", 1)
        assert key in o, key
        o[key] = value
    c = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": int(o["d"]),
         "intermediate_size": int(o["dff"]), "num_hidden_layers": int(o["layers"]),
         "num_attention_heads": int(o["heads"]), "num_key_value_heads": int(o["heads"]),
         "max_position_embeddings": int(o["ctx"]), "rope_theta": float(o["theta"]),
         "rms_norm_eps": float(o["eps"]), "vocab_size": int(o["vocab"]), "hidden_act": "silu",
         "tie_word_embeddings": False,
         "torch_dtype": {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}[o["dtype"]]}
    if o["rope"] == "parameters":  # transformers 5's spelling
        c["rope_parameters"] = {"rope_type": "default", "rope_theta": c.pop("rope_theta")}
    rng = np.random.default_rng(int(o["seed"]))
    tensors = []
    for name, shape in expected_shapes(c).items():
        scale = 1.0 if name.endswith("embed_tokens.weight") else 1 / np.sqrt(shape[-1])
        value = rng.normal(0, scale, shape) if len(shape) == 2 else 1 + 0.1 * rng.normal(size=shape)
        if o["dtype"] == "BF16":
            raw = bf16_round(value).tobytes()
        else:
            raw = value.astype(DTYPES[o["dtype"]]).tobytes()
        tensors.append((name, o["dtype"], shape, raw))
    os.makedirs(folder, exist_ok=True)
    json.dump(c, open(os.path.join(folder, "config.json"), "w"), indent=2)
    shards = int(o["shards"])
    if shards == 1:
        write_safetensors(os.path.join(folder, "model.safetensors"), tensors)
        return
    per = -(-len(tensors) // shards)
    weight_map, total = {}, 0
    for s in range(shards):
        file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = tensors[s * per:(s + 1) * per]
        write_safetensors(os.path.join(folder, file), part)
        for t in part:
            weight_map[t[0]] = file
            total += len(t[3])
    json.dump({"metadata": {"total_size": total}, "weight_map": weight_map},
              open(os.path.join(folder, "model.safetensors.index.json"), "w"), indent=2)


def damage_tensors(dst, change):
    """Rewrites DST/model.safetensors with change(list of [name, dtype, shape, raw]) applied."""
    path = os.path.join(dst, "model.safetensors")
    tensors, meta = read_safetensors(path)
    items = [[n, *v] for n, v in tensors.items()]
    change(items)
    write_safetensors(path, [tuple(t) for t in items], meta)


def damage_header(dst, change):
    """Rewrites DST/model.safetensors' header (a dict) keeping the data bytes as they are."""
    path = os.path.join(dst, "model.safetensors")
    blob = open(path, "rb").read()
    n = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8:8 + n])
    change(header)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    open(path, "wb").write(len(text).to_bytes(8, "little") + text + blob[8 + n:])


def damage_config(dst, change):
    path = os.path.join(dst, "config.json")
    c = json.load(open(path))
    change(c)
    json.dump(c, open(path, "w"), indent=2)


def set_nan(items):
    raw = bytearray(items[3][3])
    raw[4:8] = np.array([np.nan], "<f4").tobytes()
    items[3][3] = bytes(raw)


def cut_data(dst):
    path = os.path.join(dst, "model.safetensors")
    blob = open(path, "rb").read()
    open(path, "wb").write(blob[:-100])


def bad_length(dst, length):
    path = os.path.join(dst, "model.safetensors")
    blob = bytearray(open(path, "rb").read())
    blob[:8] = length.to_bytes(8, "little")
    open(path, "wb").write(bytes(blob))


def bad_json(dst):
    path = os.path.join(dst, "model.safetensors")
    blob = bytearray(open(path, "rb").read())
    blob[8] = ord("[")
    blob[9] = ord("}")
    open(path, "wb").write(bytes(blob))


def bad_byte(dst):
    path = os.path.join(dst, "model.safetensors")
    blob = bytearray(open(path, "rb").read())
    blob[9] = 0xFF
    open(path, "wb").write(bytes(blob))


def past_end(header):
    name = "model.layers.1.mlp.down_proj.weight"
    b, e = header[name]["data_offsets"]
    header[name]["data_offsets"] = [b + 10_000_000, e + 10_000_000]


CASES = {
    "short_file": lambda d: open(os.path.join(d, "model.safetensors"), "wb").write(b"\x10\0\0\0\0"),
    "header_past_end": lambda d: bad_length(d, 50_000_000),
    "header_json": bad_json,
    "header_byte": bad_byte,
    "offsets_past_end": lambda d: damage_header(d, past_end),
    "offsets_mismatch": lambda d: damage_header(
        d, lambda h: h["model.norm.weight"].update(shape=[h["model.norm.weight"]["shape"][0] * 2])),
    "truncated_data": cut_data,
    "missing_tensor": lambda d: damage_tensors(
        d, lambda items: items.remove(next(t for t in items if t[0] == "model.layers.1.mlp.up_proj.weight"))),
    "wrong_shape": lambda d: damage_tensors(
        d, lambda items: next(t for t in items if t[0] == "model.layers.0.mlp.down_proj.weight")[2].reverse()),
    "wrong_dtype": lambda d: damage_tensors(
        d, lambda items: next(t for t in items if t[0] == "model.layers.0.self_attn.v_proj.weight").__setitem__(
            1, "I32")),
    "extra_tensor": lambda d: damage_tensors(
        d, lambda items: items.append(["model.layers.0.self_attn.q_proj.bias", "F32", [4], bytes(16)])),
    "non_finite": lambda d: damage_tensors(d, set_nan),
    "no_weights": lambda d: os.remove(os.path.join(d, "model.safetensors")),
    "config_json": lambda d: open(os.path.join(d, "config.json"), "w").write('{"hidden_size": 64,'),
    "config_missing": lambda d: damage_config(d, lambda c: c.pop("hidden_size")),
    "config_type": lambda d: damage_config(d, lambda c: c.update(num_hidden_layers="2")),
    "config_sizes": lambda d: damage_config(d, lambda c: c.update(intermediate_size=c["intermediate_size"] * 2)),
    "config_gqa": lambda d: damage_config(d, lambda c: c.update(num_key_value_heads=2)),
    "config_tied": lambda d: damage_config(d, lambda c: c.update(tie_word_embeddings=True)),
    "config_bias": lambda d: damage_config(d, lambda c: c.update(attention_bias=True)),
    "config_scaling": lambda d: damage_config(d, lambda c: c.update(rope_scaling={"type": "linear", "factor": 2.0})),
    "config_rope_parameters": lambda d: damage_config(
        d, lambda c: c.update(rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0})),
    "config_rope_conflict": lambda d: damage_config(
        d, lambda c: c.update(rope_parameters={"rope_type": "default", "rope_theta": 500000.0})),
    "config_model_type": lambda d: damage_config(d, lambda c: c.update(model_type="gpt2")),
    "config_architecture": lambda d: damage_config(d, lambda c: c.update(architectures=["GPT2LMHeadModel"])),
    "config_partial_rope": lambda d: damage_config(d, lambda c: c.update(partial_rotary_factor=0.5)),
    "config_heads": lambda d: damage_config(d, lambda c: c.update(num_attention_heads=3)),
}


def shard_case(dst, case):
    index_path = os.path.join(dst, "model.safetensors.index.json")
    index = json.load(open(index_path))
    files = sorted(set(index["weight_map"].values()))
    if case == "shard_missing":
        os.remove(os.path.join(dst, files[-1]))
    elif case == "shard_wrong_file":
        name = next(n for n, f in index["weight_map"].items() if f == files[0])
        index["weight_map"][name] = files[-1]
    elif case == "shard_index_json":
        open(index_path, "w").write("{")
        return
    json.dump(index, open(index_path, "w"), indent=2)


def cmd_break(src, dst, case):
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    if case.startswith("shard_"):
        shard_case(dst, case)
    else:
        CASES[case](dst)


if __name__ == "__main__":
    commands = {"loss": cmd_loss, "logits": cmd_logits, "bf16": cmd_bf16, "make": cmd_make, "break": cmd_break}
    if len(sys.argv) < 2 or sys.argv[1] not in commands:
        sys.exit(__doc__)
    commands[sys.argv[1]](*sys.argv[2:])
