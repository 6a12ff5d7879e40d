package tokenizer

import (
	"encoding/binary"
	"fmt"
	"strings"
)

// estimate is the backend with no tokenizer: each 4-byte chunk of the
// (UTF-8) text is one "token" whose id is the chunk's bytes, little-endian;
// a final chunk of 1-3 bytes is padded with 0xFF, which never occurs in
// UTF-8. It is approximate: the count is close to a real tokenizer's on
// English (~4 bytes a token) and the ids are prefix-stable (the same text
// prefix gives the same id prefix, up to the last whole chunk), which is
// all the routers' approximate mode needs; the ids match no engine's.
// Decode inverts Encode exactly.
type estimate struct{}

var _ Tokenizer = estimate{}

func (estimate) Name() string { return "estimate" }

func (estimate) Encode(text string) ([]uint32, error) {
	text = sanitizeUTF8(text)
	ids := make([]uint32, 0, (len(text)+3)/4)
	for len(text) >= 4 {
		ids = append(ids, binary.LittleEndian.Uint32([]byte(text[:4])))
		text = text[4:]
	}
	if len(text) > 0 {
		var b = [4]byte{0xFF, 0xFF, 0xFF, 0xFF}
		copy(b[:], text)
		ids = append(ids, binary.LittleEndian.Uint32(b[:]))
	}
	return ids, nil
}

func (estimate) Decode(ids []uint32) (string, error) {
	var b strings.Builder
	b.Grow(4 * len(ids))
	for i, id := range ids {
		var c [4]byte
		binary.LittleEndian.PutUint32(c[:], id)
		n := 4
		for n > 0 && c[n-1] == 0xFF {
			n--
		}
		if n < 4 && i != len(ids)-1 || n == 0 {
			return "", fmt.Errorf("%w: %#x is not an estimate token here", ErrUnknownID, id)
		}
		b.Write(c[:n])
	}
	return b.String(), nil
}
