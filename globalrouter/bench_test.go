package globalrouter_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/pool"
	"github.com/kvgate/kvgate/pool/pooltest"
	"github.com/kvgate/kvgate/tokenizer"
)

// chat8K is a multi-turn conversation of about 8 KB of JSON text; n varies
// the last turn so that the tokenizer's chat cache helps only with the
// earlier turns, as with real traffic.
func chat8K(n int) []tokenizer.Message {
	msgs := []tokenizer.Message{{Role: "system", Content: "You are a careful assistant who answers questions about distributed systems. " + strings.Repeat("Be precise and cite sources. ", 20)}}
	for i := range 6 {
		msgs = append(msgs,
			tokenizer.Message{Role: "user", Content: fmt.Sprintf("Question %d: %s", i, longText(60))},
			tokenizer.Message{Role: "assistant", Content: fmt.Sprintf("Answer %d: %s", i, longText(70))})
	}
	return append(msgs, tokenizer.Message{Role: "user", Content: fmt.Sprintf("Final question number %d: how do KV-cache-aware routers pick a worker?", n)})
}

// BenchmarkDecide decides in-process against two pools of 8 workers, each
// behind a real local router over loopback gRPC: tokenize, hash, two
// parallel probes, the default chain, commit (Track stream) — then frees.
// It reports Decide's p50 and p99, tokenizing's p50 alone, and the ratios
// of Decide's time to tokenizing's (p50s; means from the metrics).
func BenchmarkDecide(b *testing.B) {
	ctx := testenv.Context(b)
	pa := pooltest.Start(b, "pool-a", 16, pooltest.Workers("a", 8)...)
	pb := pooltest.Start(b, "pool-b", 16, pooltest.Workers("b", 8)...)
	// Warm caches: the conversation's earlier turns sit on one worker.
	prefix := chatTokens(b, chat8K(0))
	pa.Store(b, "a-3", prefix[:len(prefix)-32])
	cfg := globalrouter.DefaultConfig(
		pool.NewConfig("pool-a", 16, []string{model}, pa.Addr),
		pool.NewConfig("pool-b", 16, []string{model}, pb.Addr),
	)
	// The deadline is not under test: a busy machine must not open
	// circuits.
	cfg.Probe.Timeout = time.Second
	r, reg := newRouter(b, cfg)
	bodyBytes := 0
	for _, m := range chat8K(0) {
		bodyBytes += len(m.Content) + 32
	}
	b.Logf("chat body ≈ %d bytes, %d tokens", bodyBytes, len(prefix))

	lat := make([]time.Duration, 0, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		req := &globalrouter.Request{Model: model, Chat: tokenizer.NewChat(chat8K(i + 1)...)}
		t0 := time.Now()
		d, err := r.Decide(ctx, req)
		lat = append(lat, time.Since(t0))
		if err != nil {
			b.Fatal(err)
		}
		if err := d.Lease.Free(ctx); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	slices.Sort(lat)
	p50 := lat[len(lat)/2]
	b.ReportMetric(float64(p50.Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
	// Tokenizing alone, the same way (the same tokenizer and its chat
	// cache, a new last turn each time): the floor of a decision.
	tok := sharedTokenizer(b)
	tl := make([]time.Duration, 0, b.N)
	for i := 0; i < b.N; i++ {
		msgs := chat8K(b.N + i + 1)
		tm := make([]tokenizer.Message, len(msgs))
		for j, m := range msgs {
			tm[j] = tokenizer.Message{Role: m.Role, Content: m.Content}
		}
		t0 := time.Now()
		if _, err := tok.EncodeChat(tokenizer.NewChat(tm...)); err != nil {
			b.Fatal(err)
		}
		tl = append(tl, time.Since(t0))
	}
	slices.Sort(tl)
	b.ReportMetric(float64(tl[len(tl)/2].Microseconds()), "tokenize-p50-µs")
	b.ReportMetric(float64(p50)/float64(tl[len(tl)/2]), "decide/tokenize-p50")
	if dec, tok := histMean(b, reg, "kvgate_globalrouter_decision_duration_seconds"), histMean(b, reg, "kvgate_globalrouter_tokenize_duration_seconds"); tok > 0 {
		b.ReportMetric(dec/tok, "decide/tokenize-mean")
	}
}

func histMean(b *testing.B, reg *prometheus.Registry, name string) float64 {
	mfs, err := reg.Gather()
	if err != nil {
		b.Fatal(err)
	}
	var sum float64
	var n uint64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			sum += m.GetHistogram().GetSampleSum()
			n += m.GetHistogram().GetSampleCount()
		}
	}
	if n == 0 {
		return 0
	}
	return sum / float64(n)
}
