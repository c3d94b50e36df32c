#!/usr/bin/env python3
"""A data folder of uniform random token ids, for speed and memory measurements (they do not depend on
the tokens): train.bin (20M tokens), val.bin (200k), meta.json. Nothing is done when the folder already
holds such a dataset of the same vocabulary; one of another vocabulary is refused.

Usage: scripts/random_tokens.py DIR VOCAB      (VOCAB 2..65536: ids are uint16)
"""
import json
import os
import sys

if len(sys.argv) != 3 or not sys.argv[2].isdigit() or not 2 <= int(sys.argv[2]) <= 65536:
    sys.exit("usage: scripts/random_tokens.py DIR VOCAB   (VOCAB 2..65536: ids are uint16)")
folder, vocab = sys.argv[1], int(sys.argv[2])
meta_path = f"{folder}/meta.json"
if os.path.exists(meta_path) and os.path.exists(f"{folder}/train.bin") and os.path.exists(f"{folder}/val.bin"):
    held = json.load(open(meta_path)).get("vocab_size")
    if held != vocab:
        sys.exit(f"error: {folder} holds random tokens of vocabulary {held}, not {vocab}: pass another DIR")
    sys.exit(0)

import numpy as np  # only when there is something to write

os.makedirs(folder, exist_ok=True)
rng = np.random.default_rng(0)
for name, n in (("train.bin", 20_000_000), ("val.bin", 200_000)):
    rng.integers(0, vocab, n, dtype=np.uint16).tofile(f"{folder}/{name}")
# No text is sampled from these ids, so no tokenizer is loaded: the name only has to be a known one.
# meta.json last: a folder without it is written again.
json.dump({"tokenizer": "gpt2" if vocab == 50257 else "sentencepiece", "vocab_size": vocab,
           "end_of_text": vocab - 1}, open(meta_path, "w"))
