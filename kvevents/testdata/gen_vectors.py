#!/usr/bin/python3
"""Generates hash_vectors.json with an independent XXH3 implementation.

Command (Debian bookworm, package python3-xxhash 3.0.0):
    /usr/bin/python3 kvevents/testdata/gen_vectors.py > kvevents/testdata/hash_vectors.json

Each case lists token ids, a block size and an optional LoRA name; the
expected local hashes are XXH3-64(LE u32 tokens of each complete block,
seed), seed = 1337 or XXH3-64(lora_name, 1337); sequence hashes chain as
seq[0] = local[0], seq[i] = XXH3-64(LE64(seq[i-1]) + LE64(local[i]), 1337).
"""
import json
import struct
import xxhash

SEED = 1337


def local_hashes(tokens, block_size, lora):
    seed = SEED if not lora else xxhash.xxh3_64_intdigest(lora.encode(), seed=SEED)
    out = []
    for i in range(0, len(tokens) - block_size + 1, block_size):
        blk = tokens[i:i + block_size]
        out.append(xxhash.xxh3_64_intdigest(struct.pack("<%dI" % len(blk), *blk), seed=seed))
    return out


def seq_hashes(local):
    out = []
    for i, h in enumerate(local):
        if i == 0:
            out.append(h)
        else:
            out.append(xxhash.xxh3_64_intdigest(struct.pack("<QQ", out[-1], h), seed=SEED))
    return out


cases = [
    {"name": "one block of 4", "tokens": [1, 2, 3, 4], "block_size": 4},
    {"name": "partial block ignored", "tokens": [1, 2, 3, 4, 5, 6], "block_size": 4},
    {"name": "three blocks of 16", "tokens": list(range(48)), "block_size": 16},
    {"name": "large ids", "tokens": [4294967295, 0, 151643, 128000] * 8, "block_size": 16},
    {"name": "block of 64", "tokens": [(i * 7919) % 152064 for i in range(200)], "block_size": 64},
    {"name": "lora adapter", "tokens": list(range(48)), "block_size": 16, "lora": "sql-adapter"},
    {"name": "shorter than a block", "tokens": [9, 9, 9], "block_size": 16},
]
for c in cases:
    loc = local_hashes(c["tokens"], c["block_size"], c.get("lora", ""))
    c["local"] = [str(h) for h in loc]
    c["sequence"] = [str(h) for h in seq_hashes(loc)]
print(json.dumps({"generator": "python3-xxhash " + xxhash.VERSION, "cases": cases}, indent=1))
