#!/usr/bin/env python3
"""Hugging Face transformers against `export` and `import`, on a GPU machine (python3 with torch,
transformers, numpy; sentencepiece for the tokenizer check).

For each case (a checkpoint and its data; by default tiny models trained here on byte-level and, when
prepare_data has it, SentencePiece tokens):
  - export (f32): LlamaForCausalLM.from_pretrained (f32, eager attention, TF32 off) gives over the windows
    `train --eval-only` evaluates (window i = val.bin tokens [i*T, i*T+T]) the loss eval-only reports, on the
    CPU and on the GPU, within 1e-4 (relative, at least absolute), and on window 0 the logits
    `train --eval-only --logits` writes, within 1e-4 of the largest logit;
  - export --dtype bf16, loaded by transformers upcast to f32, against eval-only of its import;
  - transformers' own save_pretrained (sharded safetensors) imported, against its loss;
  - config.json's eos_token_id is meta.json's end_of_text;
  - with tokenizer.model: LlamaTokenizer (and the fast tokenizer converted from it) loaded from the export
    give the ids prepare_data writes for a sample text (--tokenizer-model), and decode them back.

Usage: scripts/hf_check.py [--build build] [--device cuda] [--work DIR] [--checkpoint CKPT --data DIR]
Writes $OUT/hf_check.json (when OUT is set); exits 1 when a check fails.
"""
import argparse
import importlib.util
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile

# The checks need what a GPU machine has; elsewhere say what is missing (exit 77: skipped) instead of failing.
_missing = [name for name in ("numpy", "torch", "transformers") if importlib.util.find_spec(name) is None]
if _missing and not {"-h", "--help"} & set(sys.argv[1:]):
    print(f"skipped: hf_check.py needs {sys.executable} with {', '.join(_missing)}")
    sys.exit(77)
if _missing:  # --help without the packages: the usage above, nothing imported
    print(__doc__)
    sys.exit(0)

import numpy as np  # noqa: E402

CHECKS = []


def record(case, name, ok, detail):
    CHECKS.append({"case": case, "check": name, "ok": bool(ok), "detail": detail})
    print(f"{'ok  ' if ok else 'FAIL'} [{case}] {name}: {detail}", flush=True)


def run(cmd, what):
    result = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"{what} failed ({result.returncode}): {' '.join(map(str, cmd))}\n"
                           f"{(result.stdout + result.stderr)[-2000:]}")
    return result.stdout


def close(a, b, tolerance=1e-4):
    return abs(a - b) <= tolerance * max(1.0, abs(b))


def corpus(path, documents=3000, seed=0):
    """Documents separated by '%' lines: words, digits, punctuation, runs of spaces and non-ASCII text."""
    rng = random.Random(seed)
    words = ("the quick brown fox jumps over a lazy dog while seven wizards quietly judge boxing matches "
             "café naïve façade Straße 日本語 テキスト emoji 🙂 tab\tseparated").split(" ")
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(documents):
            lines = []
            for _ in range(rng.randint(1, 4)):
                n = rng.randint(3, 14)
                line = " ".join(rng.choice(words) for _ in range(n))
                if rng.random() < 0.3:
                    line += f" {rng.randint(0, 99999)}."
                if rng.random() < 0.1:
                    line = "  " + line.replace(" ", "   ", 1)
                lines.append(line)
            f.write("\n".join(lines) + "\n%\n")


def eval_only(apps, ckpt, data, device, json_path, ctx, batch, batches, logits_path=None):
    run([f"{apps}/train", "--eval-only", "--resume", ckpt, "--data", data, "--ctx", ctx, "--batch", batch,
         "--eval-batches", batches, "--device", device, "--json", json_path] +
        (["--logits", logits_path] if logits_path else []), "train --eval-only")
    with open(json_path) as f:
        return json.loads(f.readline())["loss"]


def logits_close(ours_npy, model, val_bin, ctx, device, tolerance=1e-4):
    """Window 0's logits from `train --eval-only --logits` against the transformers model's: the largest
    difference over the largest logit, and whether it is within `tolerance`."""
    import torch

    ours = np.load(ours_npy).astype(np.float64)
    tokens = np.fromfile(val_bin, dtype=np.uint16).astype(np.int64)[:int(ctx)]
    with torch.no_grad():
        ref = model.to(device)(input_ids=torch.tensor(tokens[None], device=device)).logits.float()
    ref = ref[0].cpu().numpy().astype(np.float64)
    worst = float(np.abs(ours - ref).max() / np.abs(ref).max()) if ours.shape == ref.shape else float("inf")
    return worst <= tolerance, worst


def hf_loss(folder, val_bin, ctx, batch, batches, device):
    import torch
    import torch.nn.functional as F
    from transformers import LlamaForCausalLM

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:
        model = LlamaForCausalLM.from_pretrained(folder, torch_dtype=torch.float32, attn_implementation="eager")
    except TypeError:  # transformers before attn_implementation
        model = LlamaForCausalLM.from_pretrained(folder, torch_dtype=torch.float32)
    model = model.to(device).eval()
    tokens = np.fromfile(val_bin, dtype=np.uint16).astype(np.int64)
    total = 0.0
    with torch.no_grad():
        for b in range(batches):
            starts = [(b * batch + i) * ctx for i in range(batch)]
            ids = torch.tensor(np.stack([tokens[s:s + ctx] for s in starts]), device=device)
            targets = torch.tensor(np.stack([tokens[s + 1:s + ctx + 1] for s in starts]), device=device)
            logits = model(input_ids=ids).logits.float()
            total += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)).item()
    return total / batches, model


def documents_of(path, end_of_text):
    ids = np.fromfile(path, dtype=np.uint16).tolist()
    docs, current = [], []
    for i in ids:
        if i == end_of_text:
            docs.append(current)
            current = []
        else:
            current.append(i)
    return docs


def check_tokenizer(case, apps, folder, data, work):
    """The ids prepare_data writes with the data's tokenizer.model for a sample, from the exported tokenizer."""
    from transformers import AutoTokenizer, LlamaTokenizer

    sample_docs = ["Hello world, this is a sample.", "  two leading spaces\nand a second line",
                   "digits 1234567 and 3.14159", "café naïve Straße 日本語 🙂", "tab\tand  double  space",
                   "ends with a space ", "\nstarts with a newline", "UPPER lower MiXeD", "a", "the last one",
                   "eleventh document", "twelfth: ,.;:!?"]
    sample = os.path.join(work, "sample.txt")
    with open(sample, "w", encoding="utf-8") as f:
        for d in sample_docs:
            f.write(d + "\n%\n")
    texts = ["".join(line + "\n" for line in d.split("\n")) for d in sample_docs]  # as prepare_data reads them
    out = os.path.join(work, "sample_data")
    shutil.rmtree(out, ignore_errors=True)
    try:
        run([f"{apps}/prepare_data", "--input", sample, "--out", out, "--separator", "%",
             "--tokenizer-model", os.path.join(data, "tokenizer.model")], "prepare_data --tokenizer-model")
        eos = json.load(open(os.path.join(out, "meta.json")))["end_of_text"]
        train_docs = documents_of(os.path.join(out, "train.bin"), eos)
        val_docs = documents_of(os.path.join(out, "val.bin"), eos)
        expected = [None] * len(texts)
        order_train = [i for i in range(len(texts)) if i % 10 != 9]
        order_val = [i for i in range(len(texts)) if i % 10 == 9]
        assert len(train_docs) == len(order_train) and len(val_docs) == len(order_val), "document count"
        for i, ids in zip(order_train + order_val, train_docs + val_docs):
            expected[i] = ids
        source = "prepare_data --tokenizer-model"
    except (RuntimeError, AssertionError) as e:
        import sentencepiece as spm
        sp = spm.SentencePieceProcessor(model_file=os.path.join(data, "tokenizer.model"))
        expected = [sp.encode(t) for t in texts]
        source = f"the sentencepiece library ({str(e).splitlines()[0][:120]})"
    for kind, loader in (("LlamaTokenizer", lambda: LlamaTokenizer.from_pretrained(folder)),
                         ("fast (AutoTokenizer)", lambda: AutoTokenizer.from_pretrained(folder, use_fast=True))):
        try:
            tok = loader()
        except Exception as e:  # noqa: BLE001 - any failure to load is the finding
            record(case, f"tokenizer {kind} loads", False, f"{type(e).__name__}: {str(e)[:200]}")
            continue
        wrong = [(t, tok.encode(t, add_special_tokens=False), ids) for t, ids in zip(texts, expected)
                 if tok.encode(t, add_special_tokens=False) != ids]
        detail = f"{len(texts) - len(wrong)}/{len(texts)} documents as {source}"
        if wrong:
            t, got, want = wrong[0]
            detail += f"; first difference: {t!r}: {got[:12]} vs {want[:12]}"
        record(case, f"tokenizer {kind} ids", not wrong, detail)
        undecoded = [t for t, ids in zip(texts, expected) if tok.decode(ids) != t]
        record(case, f"tokenizer {kind} decode", not undecoded,
               "every document decodes to its text" if not undecoded else f"first: {undecoded[0]!r}")


def check_case(case, apps, ckpt, data, device, work, ctx, batch, batches):
    import torch

    val = os.path.join(data, "val.bin")
    cpu_logits, dev_logits = os.path.join(work, "logits_cpu.npy"), os.path.join(work, "logits_dev.npy")
    cpu_loss = eval_only(apps, ckpt, data, "cpu", os.path.join(work, "eval_cpu.json"), ctx, batch, batches,
                         cpu_logits)
    dev_loss = eval_only(apps, ckpt, data, device, os.path.join(work, "eval_dev.json"), ctx, batch, batches,
                         dev_logits)
    hf = os.path.join(work, "hf")
    shutil.rmtree(hf, ignore_errors=True)
    run([f"{apps}/export", "--checkpoint", ckpt, "--out", hf, "--data", data], "export")
    ref, model = hf_loss(hf, val, ctx, batch, batches, device)
    record(case, "export f32: transformers == eval-only (cpu)", close(cpu_loss, ref),
           f"transformers {ref:.7f}, ours {cpu_loss:.7f}")
    record(case, f"export f32: transformers == eval-only ({device})", close(dev_loss, ref),
           f"transformers {ref:.7f}, ours {dev_loss:.7f}")
    for where, ours_npy in (("cpu", cpu_logits), (device, dev_logits)):
        ok, worst = logits_close(ours_npy, model, val, ctx, device)
        record(case, f"export f32: transformers logits == ours ({where}), window 0", ok,
               f"max |difference| / max |logit| = {worst:.2e} (limit 1e-4)")

    hf16 = os.path.join(work, "hf_bf16")
    shutil.rmtree(hf16, ignore_errors=True)
    run([f"{apps}/export", "--checkpoint", ckpt, "--out", hf16, "--data", data, "--dtype", "bf16"], "export bf16")
    imported = os.path.join(work, "bf16.h5")
    run([f"{apps}/import", "--from", hf16, "--out", imported, "--overwrite"], "import bf16")
    ref16, _ = hf_loss(hf16, val, ctx, batch, batches, device)
    ours16 = eval_only(apps, imported, data, "cpu", os.path.join(work, "eval_bf16.json"), ctx, batch, batches)
    record(case, "export bf16 (upcast): transformers == eval-only of its import", close(ours16, ref16),
           f"transformers {ref16:.7f}, ours {ours16:.7f}")

    saved = os.path.join(work, "hf_saved")
    shutil.rmtree(saved, ignore_errors=True)
    model.to("cpu").save_pretrained(saved, safe_serialization=True, max_shard_size="200KB")
    sharded = os.path.exists(os.path.join(saved, "model.safetensors.index.json"))
    imported = os.path.join(work, "saved.h5")
    run([f"{apps}/import", "--from", saved, "--out", imported, "--overwrite"], "import save_pretrained")
    ours_saved = eval_only(apps, imported, data, "cpu", os.path.join(work, "eval_saved.json"), ctx, batch, batches)
    record(case, f"save_pretrained ({'sharded' if sharded else 'one file'}) imported == transformers",
           close(ours_saved, ref), f"transformers {ref:.7f}, ours {ours_saved:.7f}")

    config = json.load(open(os.path.join(hf, "config.json")))
    meta_path = os.path.join(data, "meta.json")
    if os.path.exists(meta_path):
        eos = json.load(open(meta_path)).get("end_of_text")
        record(case, "config.json eos_token_id", config.get("eos_token_id") == eos,
               f"{config.get('eos_token_id')} (meta.json end_of_text {eos})")
    if os.path.exists(os.path.join(data, "tokenizer.model")):
        check_tokenizer(case, apps, hf, data, work)
    del model
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", default="build", help="build folder with apps/ (default: build)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--work", help="working folder (default: a temporary one, removed)")
    parser.add_argument("--checkpoint", help="check this checkpoint (with --data) instead of training")
    parser.add_argument("--data", help="the checkpoint's data folder")
    parser.add_argument("--steps", type=int, default=60, help="training steps of the models trained here")
    parser.add_argument("--ctx", type=int, default=64)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--eval-batches", type=int, default=4)
    args = parser.parse_args()
    apps = os.path.abspath(os.path.join(args.build, "apps"))
    work = args.work or tempfile.mkdtemp(prefix="hf_check.")
    os.makedirs(work, exist_ok=True)
    cases = []
    try:
        if args.checkpoint:
            if not args.data:
                sys.exit("--checkpoint needs --data")
            cases.append(("checkpoint", args.checkpoint, args.data))
        else:
            text = os.path.join(work, "text.txt")
            corpus(text)
            for tokenizer in ("bytes", "sentencepiece"):
                data = os.path.join(work, f"data_{tokenizer}")
                shutil.rmtree(data, ignore_errors=True)
                extra = ["--tokenizer", "sentencepiece", "--vocab", "512"] if tokenizer == "sentencepiece" else []
                try:
                    run([f"{apps}/prepare_data", "--input", text, "--out", data, "--separator", "%", *extra],
                        "prepare_data")
                except RuntimeError as e:
                    record(tokenizer, "prepare_data", tokenizer == "sentencepiece", f"not run: {str(e)[:300]}")
                    continue
                out = os.path.join(work, f"run_{tokenizer}")
                shutil.rmtree(out, ignore_errors=True)
                run([f"{apps}/train", "--preset", "tiny", "--data", data, "--out", out, "--steps", args.steps,
                     "--batch", 8, "--ctx", args.ctx, "--device", args.device, "--eval-every", 0, "--ckpt-every",
                     0, "--eval-batches", 1, "--sample-tokens", 0], "train")
                cases.append((tokenizer, os.path.join(out, "checkpoints", f"step_{args.steps}.h5"), data))
        for case, ckpt, data in cases:
            case_work = os.path.join(work, f"check_{case}")
            os.makedirs(case_work, exist_ok=True)
            try:
                check_case(case, apps, ckpt, data, args.device, case_work, args.ctx, args.batch, args.eval_batches)
            except Exception as e:  # noqa: BLE001 - report and go on with the next case
                record(case, "ran to the end", False, f"{type(e).__name__}: {e}")
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    failed = [c for c in CHECKS if not c["ok"]]
    if os.environ.get("OUT"):
        os.makedirs(os.environ["OUT"], exist_ok=True)
        with open(os.path.join(os.environ["OUT"], "hf_check.json"), "w") as f:
            json.dump({"checks": CHECKS, "failed": len(failed)}, f, indent=2)
    print(f"{len(CHECKS) - len(failed)} of {len(CHECKS)} checks passed")
    sys.exit(1 if failed or not CHECKS else 0)


if __name__ == "__main__":
    main()
