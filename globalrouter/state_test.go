package globalrouter_test

import (
	"errors"
	"sync"
	"testing"

	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/internal/testenv"
)

// TestDecideAcrossReloads: decisions running while the configuration is
// swapped all succeed (a retired state waits for the decisions holding
// it before its pools close), and a closed router refuses at once.
func TestDecideAcrossReloads(t *testing.T) {
	ctx := testenv.Context(t)
	c := newCluster(t)
	r, _ := newRouter(t, c.cfg)
	const workers, each = 4, 10
	var wg sync.WaitGroup
	errs := make(chan error, workers*each)
	for range workers {
		wg.Go(func() {
			for range each {
				d, err := r.Decide(ctx, &globalrouter.Request{Model: model, Prompt: "hello there"})
				if err != nil {
					errs <- err
					continue
				}
				if err := d.Lease.Free(ctx); err != nil {
					errs <- err
				}
			}
		})
	}
	for range 5 {
		if err := r.Reload(c.cfg); err != nil {
			t.Errorf("Reload: %v", err)
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("Decide during reloads: %v", err)
	}
	if err := r.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if _, err := r.Decide(ctx, &globalrouter.Request{Model: model, Prompt: "hi"}); !errors.Is(err, globalrouter.ErrNoPool) {
		t.Errorf("Decide after Close: got %v, want ErrNoPool", err)
	}
}
