package subtree

import (
	"encoding/binary"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	localrouterv1 "github.com/kvgate/kvgate/api/localrouter/v1"
)

// FuzzPrompt: any wire prompt converts to a pool.Prompt or to
// INVALID_ARGUMENT, never a panic; the hashes are the ones sent (packed
// ones little-endian) and ISL defaults as a local router's does.
func FuzzPrompt(f *testing.F) {
	f.Add([]byte{1, 2, 3, 4, 5, 6, 7, 8}, []byte{}, uint32(16), uint32(0), false)
	f.Add([]byte{}, []byte{1, 0, 0, 0, 2, 0, 0, 0}, uint32(0), uint32(5), false)
	f.Add([]byte{1, 2, 3}, []byte{}, uint32(16), uint32(0), true)
	f.Fuzz(func(t *testing.T, packed, tokens []byte, bs, isl uint32, nilPrompt bool) {
		var p *localrouterv1.Prompt
		if !nilPrompt {
			p = &localrouterv1.Prompt{BlockSize: bs, IslTokens: isl}
			for i := 0; i+4 <= len(tokens); i += 4 {
				p.TokenIds = append(p.TokenIds, binary.LittleEndian.Uint32(tokens[i:]))
			}
		}
		out, err := prompt(p, packed)
		if err != nil {
			if status.Code(err) != codes.InvalidArgument {
				t.Fatalf("error %v is not INVALID_ARGUMENT", err)
			}
			return
		}
		if len(packed) > 0 {
			if len(out.Hashes) != len(packed)/8 || out.Tokens != nil {
				t.Fatalf("%d packed bytes gave %d hashes and %d tokens", len(packed), len(out.Hashes), len(out.Tokens))
			}
			for i, h := range out.Hashes {
				if h != binary.LittleEndian.Uint64(packed[i*8:]) {
					t.Fatalf("hash %d: %x", i, h)
				}
			}
			if out.BlockSize <= 0 || (isl == 0 && out.ISL != len(out.Hashes)*out.BlockSize) {
				t.Fatalf("block size %d, ISL %d for %d hashes", out.BlockSize, out.ISL, len(out.Hashes))
			}
		} else if len(out.Tokens) == 0 || (isl == 0 && out.ISL != len(out.Tokens)) {
			t.Fatalf("tokens %d, ISL %d", len(out.Tokens), out.ISL)
		}
	})
}
