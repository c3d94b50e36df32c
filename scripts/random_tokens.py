#!/usr/bin/env python3
"""A data folder of uniform random token ids, for speed and memory measurements (they do not depend on
the tokens): train.bin (20M tokens), val.bin (200k), meta.json. Nothing is done when train.bin exists.

Usage: scripts/random_tokens.py DIR VOCAB
"""
import json
import os
import sys

import numpy as np

folder, vocab = sys.argv[1], int(sys.argv[2])
if not os.path.exists(f"{folder}/train.bin"):
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(0)
    for name, n in (("train.bin", 20_000_000), ("val.bin", 200_000)):
        rng.integers(0, vocab, n, dtype=np.uint16).tofile(f"{folder}/{name}")
    # No text is sampled from these ids, so no tokenizer is loaded: the name only has to be a known one.
    json.dump({"tokenizer": "gpt2" if vocab == 50257 else "sentencepiece", "vocab_size": vocab,
               "end_of_text": vocab - 1}, open(f"{folder}/meta.json", "w"))
