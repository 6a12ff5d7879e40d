#!/usr/bin/python3
"""Generates hash_vectors.json with an independent XXH3 implementation.

Command (Debian bookworm, package python3-xxhash 3.0.0):
    /usr/bin/python3 kvevents/testdata/gen_vectors.py > kvevents/testdata/hash_vectors.json

Each case lists token ids, a block size, an optional LoRA name, cache salt
and multimodal items (content hash, offset, length of the placeholder run);
the expected local hashes are XXH3-64(LE u32 tokens of each complete block
followed by the sorted LE u64 hashes of the items overlapping it, seed),
with seed = 1337 + XXH3-64(lora_name, 0) [+ XXH3-64(cache_salt, 1)],
wrapping adds, as Dynamo computes it (lib/kv-router/src/protocols.rs
compute_block_hash_for_seq; lib/kv-hashing/src/salt.rs compute_salt_hash);
sequence hashes chain as seq[0] = local[0],
seq[i] = XXH3-64(LE64(seq[i-1]) + LE64(local[i]), 1337).
"""
import json
import struct
import xxhash

SEED = 1337


M64 = (1 << 64) - 1


def local_hashes(tokens, block_size, lora, salt, mm):
    seed = SEED
    if lora:
        seed = (seed + xxhash.xxh3_64_intdigest(lora.encode(), seed=0)) & M64
    if salt:
        seed = (seed + xxhash.xxh3_64_intdigest(salt.encode(), seed=1)) & M64
    out = []
    for i in range(0, len(tokens) - block_size + 1, block_size):
        blk = tokens[i:i + block_size]
        data = struct.pack("<%dI" % len(blk), *blk)
        hs = sorted(int(h) for h, off, n in mm if n > 0 and off < i + block_size and off + n > i)
        data += b"".join(struct.pack("<Q", h) for h in hs)
        out.append(xxhash.xxh3_64_intdigest(data, seed=seed))
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
    {"name": "cache salt", "tokens": list(range(48)), "block_size": 16, "salt": "tenant-a"},
    {"name": "adapter and salt", "tokens": list(range(48)), "block_size": 16, "lora": "sql-adapter", "salt": "tenant-a"},
    {"name": "image in block 1", "tokens": list(range(16)) + [0] * 16 + list(range(16)), "block_size": 16,
     "mm": [[str(0xDEADBEEFDEADBEEF), 16, 16]]},
    {"name": "another image, same placeholders", "tokens": list(range(16)) + [0] * 16 + list(range(16)), "block_size": 16,
     "mm": [[str(0x0123456789ABCDEF), 16, 16]]},
    {"name": "two images across blocks", "tokens": [7] * 48, "block_size": 16,
     "mm": [[str(18000000000000000000), 10, 12], [str(5), 20, 4]]},
]
for c in cases:
    loc = local_hashes(c["tokens"], c["block_size"], c.get("lora", ""), c.get("salt", ""), c.get("mm", []))
    c["local"] = [str(h) for h in loc]
    c["sequence"] = [str(h) for h in seq_hashes(loc)]
print(json.dumps({"generator": "python3-xxhash " + xxhash.VERSION, "cases": cases}, indent=1))
