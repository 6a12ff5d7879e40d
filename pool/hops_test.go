package pool_test

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"google.golang.org/grpc/metadata"

	"github.com/kvgate/kvgate/pool"
)

func TestHops(t *testing.T) {
	ctx := context.Background()
	if n := pool.Hops(ctx); n != 0 {
		t.Errorf("no metadata: %d hops", n)
	}
	c3 := pool.WithHops(metadata.AppendToOutgoingContext(ctx, "other", "kept"), 3)
	if n := pool.Hops(c3); n != 3 {
		t.Errorf("WithHops 3: %d", n)
	}
	if n := pool.Hops(pool.WithHops(c3, 4)); n != 4 {
		t.Errorf("WithHops 4 over 3: %d (the count is replaced, not added)", n)
	}
	if v := metadata.ValueFromOutgoingContext(c3, "other"); len(v) != 1 {
		t.Errorf("WithHops dropped other metadata: %v", v)
	}
	for _, tt := range []struct {
		v    string
		n    int
		fail bool
	}{{"0", 0, false}, {"8", 8, false}, {"-1", 0, true}, {"x", 0, true}, {"", 0, true}, {"99999999", 0, true}} {
		in := metadata.NewIncomingContext(ctx, metadata.Pairs(pool.HopsMetadata, tt.v))
		n, err := pool.IncomingHops(in)
		if (err != nil) != tt.fail || n != tt.n {
			t.Errorf("incoming %q: %d, %v", tt.v, n, err)
		}
		if err != nil && !strings.Contains(err.Error(), pool.HopsMetadata) {
			t.Errorf("incoming %q: the error %q does not name the key", tt.v, err)
		}
	}
}

// FuzzIncomingHops: any metadata value is a count 0..65536 or an error
// naming the key, and a count read back is the one written.
func FuzzIncomingHops(f *testing.F) {
	for _, s := range []string{"0", "1", "8", "-3", "0x10", " 7", "65537", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		n, err := pool.IncomingHops(metadata.NewIncomingContext(context.Background(), metadata.Pairs(pool.HopsMetadata, v)))
		if err != nil {
			if !strings.Contains(err.Error(), pool.HopsMetadata) {
				t.Fatalf("%q: error %q does not name the key", v, err)
			}
			return
		}
		if want, aerr := strconv.Atoi(v); aerr != nil || n != want || n < 0 || n > 1<<16 {
			t.Fatalf("%q read as %d", v, n)
		}
		if got := pool.Hops(pool.WithHops(context.Background(), n)); got != n {
			t.Fatalf("WithHops(%d) reads back %d", n, got)
		}
	})
}
