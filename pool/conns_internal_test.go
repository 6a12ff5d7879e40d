package pool

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
)

// closeCounter is a Client that counts its Close calls and, like a gRPC
// client connection, refuses a second one.
type closeCounter struct {
	Client // nil: nothing else is called
	n      atomic.Int32
}

func (c *closeCounter) Close() error {
	if c.n.Add(1) > 1 {
		return errors.New("grpc: the client connection is closing")
	}
	return nil
}

// A Router's Close releases its pools' references while it closes the
// Conns; a lease freed in the same moment drops the last reference. The
// client is closed exactly once, by whichever comes first, and Close
// reports no error (e2e TestRegionsTopology once failed on the second
// close's "client connection is closing").
func TestConnsCloseRacesLastRelease(t *testing.T) {
	// Both orders in turn, then both at once.
	for _, first := range []string{"close", "release"} {
		cl := &closeCounter{}
		cs := NewConns(func(string) (Client, error) { return cl, nil }, CircuitOptions{}, nil)
		c, err := cs.acquire("a:1")
		if err != nil {
			t.Fatal(err)
		}
		var closeErr error
		if first == "close" {
			closeErr = cs.Close()
			cs.release(c)
		} else {
			cs.release(c)
			closeErr = cs.Close()
		}
		if closeErr != nil {
			t.Fatalf("%s first: Close: %v", first, closeErr)
		}
		if n := cl.n.Load(); n != 1 {
			t.Fatalf("%s first: the client was closed %d times, want 1", first, n)
		}
	}
	for range 200 {
		cl := &closeCounter{}
		cs := NewConns(func(string) (Client, error) { return cl, nil }, CircuitOptions{}, nil)
		c, err := cs.acquire("a:1")
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		var closeErr error
		wg.Add(2)
		go func() { defer wg.Done(); closeErr = cs.Close() }()
		go func() { defer wg.Done(); cs.release(c) }()
		wg.Wait()
		if closeErr != nil {
			t.Fatalf("Close: %v", closeErr)
		}
		if n := cl.n.Load(); n != 1 {
			t.Fatalf("the client was closed %d times, want 1", n)
		}
	}
}
