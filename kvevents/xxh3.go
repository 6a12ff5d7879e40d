package kvevents

import (
	"encoding/binary"
	"math/bits"
	"unsafe"

	"github.com/zeebo/xxh3"
)

// Specialised XXH3-64 paths for the two sizes kvgate hashes on every
// request: 16 bytes (a chained sequence hash) and 17–128 bytes (a block of
// 16 or 32 tokens). They follow xxhash.h's XXH3_len_9to16_64b and
// XXH3_len_17to128_64b with the default secret, and are checked against an
// independent implementation in xxh3_test.go; other sizes go to
// github.com/zeebo/xxh3, whose seeded entry point is about twice as slow
// on these sizes.

const (
	prime64_1 = 0x9E3779B185EBCA87

	// The default secret, as little-endian words at byte offsets 0..120.
	sec000 = 0xbe4ba423396cfeb8
	sec008 = 0x1cad21f72c81017c
	sec016 = 0xdb979083e96dd4de
	sec024 = 0x1f67b3b7a4a44072
	sec032 = 0x78e5c0cc4ee679cb
	sec040 = 0x2172ffcc7dd05a82
	sec048 = 0x8e2443f7744608b8
	sec056 = 0x4c263a81e69035e0
	sec064 = 0xcb00c391bb52283c
	sec072 = 0xa32e531b8b65d088
	sec080 = 0x4ef90da297486471
	sec088 = 0xd8acdea946ef1938
	sec096 = 0x3f349ce33f76faa8
	sec104 = 0x1d4f0bc7c7bbdcf9
	sec112 = 0x3159b4cd4be0518a
	sec120 = 0x647378d9c97e9fc8
)

func mulFold64(a, b uint64) uint64 {
	hi, lo := bits.Mul64(a, b)
	return hi ^ lo
}

func avalanche(h uint64) uint64 {
	h ^= h >> 37
	h *= 0x165667919E3779F9
	return h ^ (h >> 32)
}

// hash16 is XXH3-64 of LE(a) ‖ LE(b) with seed.
func hash16(a, b, seed uint64) uint64 {
	lo := a ^ (sec024 ^ sec032 + seed)
	hi := b ^ (sec040 ^ sec048 - seed)
	return avalanche(16 + bits.ReverseBytes64(lo) + hi + mulFold64(lo, hi))
}

func le64(p []byte, i int) uint64 { return binary.LittleEndian.Uint64(p[i:]) }

func mix16(p []byte, i int, s0, s1, seed uint64) uint64 {
	return mulFold64(le64(p, i)^(s0+seed), le64(p, i+8)^(s1-seed))
}

// hashBytes is XXH3-64 of p with seed.
func hashBytes(p []byte, seed uint64) uint64 {
	l := len(p)
	if l <= 16 || l > 128 {
		return xxh3.HashSeed(p, seed)
	}
	acc := uint64(l) * prime64_1
	if l > 32 {
		if l > 64 {
			if l > 96 {
				acc += mix16(p, 48, sec096, sec104, seed)
				acc += mix16(p, l-64, sec112, sec120, seed)
			}
			acc += mix16(p, 32, sec064, sec072, seed)
			acc += mix16(p, l-48, sec080, sec088, seed)
		}
		acc += mix16(p, 16, sec032, sec040, seed)
		acc += mix16(p, l-32, sec048, sec056, seed)
	}
	acc += mix16(p, 0, sec000, sec008, seed)
	acc += mix16(p, l-16, sec016, sec024, seed)
	return avalanche(acc)
}

// tokenBytes views tokens as little-endian bytes (in place on
// little-endian hosts).
func tokenBytes(tokens []uint32) []byte {
	if littleEndian {
		return unsafe.Slice((*byte)(unsafe.Pointer(&tokens[0])), len(tokens)*4)
	}
	b := make([]byte, len(tokens)*4)
	for i, t := range tokens {
		binary.LittleEndian.PutUint32(b[4*i:], t)
	}
	return b
}
