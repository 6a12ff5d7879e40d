#!/usr/bin/python3
"""XXH3-64 vectors for every length 0..256 and several seeds.

Command (Debian bookworm, python3-xxhash 3.0.0):
    /usr/bin/python3 kvevents/testdata/gen_xxh3_vectors.py > kvevents/testdata/xxh3_vectors.json

The input of length n is bytes((i*131 + 7) & 0xff for i in range(n)).
"""
import json
import xxhash

data = bytes((i * 131 + 7) & 0xFF for i in range(256))
out = []
for seed in (0, 1337, 2**64 - 1, 0x9E3779B97F4A7C15):
    for n in range(257):
        out.append({"len": n, "seed": str(seed), "hash": str(xxhash.xxh3_64_intdigest(data[:n], seed=seed))})
print(json.dumps(out))
