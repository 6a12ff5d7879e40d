package client_test

import (
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kvgate/kvgate/api/routing"
	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/localrouter"
	"github.com/kvgate/kvgate/localrouter/client"
)

// TestScoresCrossTheWire: under a worker chain each scorer's part reaches
// the Go client, over the unary call and over the channel; the session
// key reaches the router (the session scorer sees it).
func TestScoresCrossTheWire(t *testing.T) {
	cfg := localrouter.DefaultConfig()
	specs, err := localrouter.ParseWorkerChain("cost=1,prefix=4,session=2")
	if err != nil {
		t.Fatal(err)
	}
	cfg.WorkerChain = specs
	p := startPoolWith(cfg, "a", "b")
	defer p.stop()
	toks := prompt(1, 64)
	p.cache("b", toks, 4)
	c, err := client.Dial(p.addr, []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ch := c.Channel(client.ChannelOptions{})
	defer ch.Close()
	ctx := testenv.Context(t)
	for name, bw := range map[string]func(client.Prompt) (string, []float64, error){
		"unary": func(pr client.Prompt) (string, []float64, error) {
			s, err := c.BestWorker(ctx, pr, client.BestWorkerOptions{})
			return s.WorkerID, contributions(s.Scores), err
		},
		"channel": func(pr client.Prompt) (string, []float64, error) {
			s, err := ch.BestWorker(ctx, pr, client.BestWorkerOptions{})
			return s.WorkerID, contributions(s.Scores), err
		},
	} {
		id, got, err := bw(client.Prompt{Tokens: toks, SessionKey: "s1"})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		// b holds the whole prompt: cost = max(0, 4 prefill blocks - 4
		// cached) + 4 decode blocks = 4; prefix -1 × 4; session 0 or 2
		// by where s1 hashes.
		if id != "b" || len(got) != 3 || got[0] != 4 || got[1] != -4 || (got[2] != 0 && got[2] != 2) {
			t.Errorf("%s: chose %s with contributions %v; want b with [4 -4 0|2]", name, id, got)
		}
	}
}

func contributions(s []routing.Score) []float64 {
	out := make([]float64, len(s))
	for i, v := range s {
		out[i] = v.Contribution
	}
	return out
}

// TestTTFTCrossesTheWire: the predicted time to first token of the
// request alone (ttft_ms; flow control reads it) reaches the Go client
// over the unary call and the channel: positive, and below Cost by the
// delay the request's uncached prefill imposes on those behind it.
func TestTTFTCrossesTheWire(t *testing.T) {
	p := startPoolWith(localrouter.DefaultConfig(), "a")
	defer p.stop()
	c, err := client.Dial(p.addr, []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ch := c.Channel(client.ChannelOptions{})
	defer ch.Close()
	ctx := testenv.Context(t)
	pr := client.Prompt{Tokens: prompt(1, 64)}
	for name, bw := range map[string]func() (routing.Selection, error){
		"unary":   func() (routing.Selection, error) { return c.BestWorker(ctx, pr, client.BestWorkerOptions{}) },
		"channel": func() (routing.Selection, error) { return ch.BestWorker(ctx, pr, client.BestWorkerOptions{}) },
	} {
		s, err := bw()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !(s.TTFT > 0) || !(s.TTFT < s.Cost) {
			t.Errorf("%s: TTFT %g ms, Cost %g ms; want 0 < TTFT < Cost (64 uncached tokens)", name, s.TTFT, s.Cost)
		}
	}
}
