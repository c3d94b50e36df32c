"""Damages a checkpoint the way a bad disk would: flips one byte in the middle of a dataset's stored data
(its first chunk, or the whole of an unchunked one), leaving its checksum as it was.
Usage: flip_byte.py FILE DATASET (e.g. model/token_embeddings.weight). Needs h5py."""
import sys

import h5py

path, dataset = sys.argv[1], sys.argv[2]
with h5py.File(path, "r") as f:
    d = f[dataset]
    if d.chunks:
        info = d.id.get_chunk_info(0)
        offset = info.byte_offset + info.size // 2
    else:
        offset = d.id.get_offset() + d.id.get_storage_size() // 2
with open(path, "r+b") as raw:
    raw.seek(offset)
    byte = raw.read(1)[0]
    raw.seek(offset)
    raw.write(bytes([byte ^ 0xFF]))
