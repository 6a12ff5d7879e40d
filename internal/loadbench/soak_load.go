package loadbench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// oneRequest runs a short completion to the end.
func oneRequest(ctx context.Context, hc *http.Client, url, model string) error {
	body := fmt.Sprintf(`{"model":%q,"prompt":"warm up the soak","max_tokens":2,"stream":true}`, model)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("content-type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("status %d: %s", resp.StatusCode, b)
	}
	_, err = io.Copy(io.Discard, resp.Body)
	return err
}

// stream opens streaming completion i, calls open once its response
// headers came (the decision is made and the worker has it), and reads it
// until ctx ends. A stream that ends before is an error.
func stream(ctx context.Context, hc *http.Client, url, model string, i int, open func()) error {
	// Prompts share a prefix by family, as chat traffic does.
	prompt := fmt.Sprintf("system prompt of family %d: you are a helpful assistant. ", i%32) + strings.Repeat("context ", 40) + fmt.Sprintf("question %d", i)
	body := fmt.Sprintf(`{"model":%q,"prompt":%q,"max_tokens":4096,"stream":true}`, model, prompt)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("content-type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("status %d: %s", resp.StatusCode, bytes.TrimSpace(b))
	}
	open()
	_, err = io.Copy(io.Discard, resp.Body)
	if ctx.Err() == nil {
		return fmt.Errorf("stream ended during the hold: %v", err)
	}
	return nil
}

// steadyLoad sends one short streaming request every period while the
// streams are held, each cancelled once its response headers came (its
// decision made, on its worker): the decisions of the steady state.
type steadyLoad struct {
	paused       atomic.Bool
	sent, failed atomic.Int64
	wg           sync.WaitGroup
	cancel       context.CancelFunc
}

func startSteady(ctx context.Context, hc *http.Client, url, model string, period time.Duration) *steadyLoad {
	ctx, cancel := context.WithCancel(ctx)
	s := &steadyLoad{cancel: cancel}
	if period < 0 {
		return s
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		t := time.NewTicker(period)
		defer t.Stop()
		for i := 0; ; i++ {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if s.paused.Load() {
				continue
			}
			s.sent.Add(1)
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				rctx, rcancel := context.WithCancel(ctx)
				defer rcancel()
				// Headers received: decided and on its worker; go away.
				err := stream(rctx, hc, url, model, 1_000_000+i, rcancel)
				if err != nil && ctx.Err() == nil {
					s.failed.Add(1)
				}
			}()
		}
	}()
	return s
}

func (s *steadyLoad) pause(p bool) { s.paused.Store(p) }

// stop ends the paced requests and waits for them.
func (s *steadyLoad) stop() (sent, failed int) {
	s.cancel()
	s.wg.Wait()
	return int(s.sent.Load()), int(s.failed.Load())
}
