package extproc_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvgate/kvgate/envoy/extprocclient"
	"github.com/kvgate/kvgate/extproc"
	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/pool"
	"github.com/kvgate/kvgate/pool/pooltest"
	"github.com/kvgate/kvgate/tokenizer"
)

// benchParagraph is the bulk of an ~8 KB chat body.
var benchParagraph = func() string {
	var para strings.Builder
	for i := 0; para.Len() < 7800; i++ {
		fmt.Fprintf(&para, "Paragraph %d: a router that knows which worker holds a prompt's prefix in its KV cache saves the prefill of that prefix. ", i)
	}
	return para.String()
}()

// benchBody is the i-th of a series of distinct ~8 KB chat bodies, and its
// messages. Every body differs from its first words on, so neither the
// tokenizer's chat cache nor the KV index answers from an earlier request:
// each decision tokenizes and hashes the whole prompt, cold.
func benchBody(series string, i int) ([]byte, []tokenizer.Message) {
	m := []tokenizer.Message{
		{Role: "system", Content: fmt.Sprintf("%s %d: you are a helpful assistant.", series, i)},
		{Role: "user", Content: benchParagraph},
	}
	b, _ := json.Marshal(map[string]any{"model": "m", "stream": true, "messages": m})
	return b, m
}

// benchSystem is the decision path of BenchmarkDecision: two real local
// routers of 8 workers each (pooltest), the real global router, the real
// ext_proc server on loopback gRPC, the Envoy-faithful client in the
// shipped bootstrap's modes.
func benchSystem(b *testing.B) *extprocclient.Client {
	b.Helper()
	router := benchRouter(b)
	conn, _ := startServer(b, extproc.Config{}, router)
	return envoyClient(b, conn, allModes[1])
}

// benchRouter is the real global router over two real local routers of 8
// workers each.
func benchRouter(b *testing.B) *globalrouter.Router {
	b.Helper()
	a := pooltest.Start(b, "pool-a", 16, pooltest.Workers("a", 8)...)
	c := pooltest.Start(b, "pool-b", 16, pooltest.Workers("b", 8)...)
	cfg := globalrouter.DefaultConfig(
		pool.NewConfig("pool-a", 16, []string{"m"}, a.Addr),
		pool.NewConfig("pool-b", 16, []string{"m"}, c.Addr),
	)
	// A starved CPU (shared machines, -race) stretches probes; a refused
	// request would not measure a decision.
	cfg.Probe.Timeout = time.Second
	router, err := globalrouter.New(cfg, globalrouter.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { router.Close() })
	return router
}

// exchange runs one request through the filter up to its release towards
// the upstream (what Envoy waits for before connecting to the worker), then
// ends the stream (which frees the request on its local router).
func exchange(b *testing.B, c *extprocclient.Client, body []byte) time.Duration {
	ctx := testenv.Context(b)
	start := time.Now()
	s := c.Open(ctx, nil)
	defer s.Close()
	if err := s.SendRequestHeaders(ctx, post("/v1/chat/completions"), false); err != nil {
		b.Fatal(err)
	}
	if err := s.SendRequestData(ctx, body, true); err != nil {
		b.Fatal(err)
	}
	for {
		f, err := s.ReadUpstream(ctx)
		if errors.Is(err, io.EOF) {
			break
		}
		if errors.Is(err, extprocclient.ErrLocalReply) {
			lr := s.Info().LocalReply
			b.Fatalf("local reply %d %s", lr.Status, lr.Body)
		}
		if err != nil {
			b.Fatal(err)
		}
		if f.Kind == extprocclient.FrameHeaders {
			if _, ok := f.Headers.Get("x-gateway-destination-endpoint"); !ok {
				b.Fatal("request released without a destination")
			}
		}
	}
	return time.Since(start)
}

// cpuTime is the process's user+system CPU (getrusage): the client, the
// ext_proc server, the global router and both local routers together, as
// every part of the benchmark runs in this process.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func quantile(d []time.Duration, q float64) time.Duration {
	slices.Sort(d)
	return d[min(len(d)-1, int(q*float64(len(d))))]
}

// BenchmarkDecision measures a routing decision as Envoy sees it: request
// headers and an 8 KB chat body in over gRPC, routing headers and the body
// back, through parse, tokenize, hash, two parallel probes, the policy chain
// and the commit. It reports p50/p99, the tokenize-only time of the same
// bodies and the ratio, (parallel) requests per second per core, and the
// CPU per request of the whole process (cpu-µs/req: client, ext_proc
// server, global router and local routers, all here), which is what decides
// whether a paced rate fits the machine's cores.
//
//	go test -run '^$' -bench BenchmarkDecision -benchtime 3000x ./extproc
func BenchmarkDecision(b *testing.B) {
	// The tokenize-only baseline runs on its own tokenizer, on the same
	// distinct bodies, each once, as the router's tokenizer sees them.
	tokenize := func(series string, n int) time.Duration {
		tok, err := tokenizer.Load(globalrouter.DefaultTokenizer)
		if err != nil {
			b.Fatal(err)
		}
		var total time.Duration
		for i := range n {
			_, m := benchBody(series, i)
			t0 := time.Now()
			if _, err := tok.EncodeChat(tokenizer.NewChat(m...)); err != nil {
				b.Fatal(err)
			}
			total += time.Since(t0)
		}
		return total / time.Duration(max(n, 1))
	}
	b.Run("latency", func(b *testing.B) {
		c := benchSystem(b)
		for i := range 32 { // warm connections
			body, _ := benchBody("warm", i)
			exchange(b, c, body)
		}
		bodies := make([][]byte, b.N)
		for i := range bodies {
			bodies[i], _ = benchBody("latency", i)
		}
		lat := make([]time.Duration, 0, b.N)
		b.ReportAllocs()
		b.ResetTimer()
		cpu0 := cpuTime()
		for i := range b.N { // not b.Loop: b.N must be known to build the bodies
			lat = append(lat, exchange(b, c, bodies[i]))
		}
		cpu := cpuTime() - cpu0
		b.StopTimer()
		p50 := quantile(lat, 0.5)
		b.ReportMetric(float64(cpu.Microseconds())/float64(len(lat)), "cpu-µs/req")
		tokMean := tokenize("latency", len(lat))
		b.ReportMetric(float64(p50.Microseconds()), "p50-µs")
		b.ReportMetric(float64(quantile(lat, 0.99).Microseconds()), "p99-µs")
		b.ReportMetric(float64(tokMean.Microseconds()), "tokenize-µs")
		b.ReportMetric(float64(p50)/float64(tokMean), "exchange/tokenize")
	})
	b.Run("overhead", func(b *testing.B) {
		// The same exchange with a Decider double that answers at once:
		// what the ext_proc server, gRPC and the client cost without the
		// decision.
		conn, _ := startServer(b, extproc.Config{}, &deciderDouble{})
		c := envoyClient(b, conn, allModes[1])
		lat := make([]time.Duration, 0, b.N)
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; b.Loop(); i++ {
			body, _ := benchBody("overhead", i)
			lat = append(lat, exchange(b, c, body))
		}
		b.ReportMetric(float64(quantile(lat, 0.5).Microseconds()), "p50-µs")
		b.ReportMetric(float64(quantile(lat, 0.99).Microseconds()), "p99-µs")
	})
	b.Run("decide", func(b *testing.B) {
		// globalrouter.Decide alone (tokenize, hash, two probes over gRPC,
		// policies, commit), then Free: the decision the ratio is about.
		router := benchRouter(b)
		ctx := testenv.Context(b)
		lat := make([]time.Duration, 0, b.N)
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; b.Loop(); i++ {
			_, m := benchBody("decide", i)
			r := globalrouter.Request{ID: fmt.Sprint("b", i), Path: "/v1/chat/completions", Model: "m"}
			for _, x := range m {
				if r.Chat == nil {
					r.Chat = tokenizer.NewChat()
				}
				r.Chat.Messages = append(r.Chat.Messages, x)
			}
			t0 := time.Now()
			d, err := router.Decide(ctx, &r)
			lat = append(lat, time.Since(t0))
			if err != nil {
				b.Fatal(err)
			}
			_ = d.Lease.Free(ctx)
		}
		b.StopTimer()
		p50, tokMean := quantile(lat, 0.5), tokenize("decide", len(lat))
		b.ReportMetric(float64(p50.Microseconds()), "p50-µs")
		b.ReportMetric(float64(quantile(lat, 0.99).Microseconds()), "p99-µs")
		b.ReportMetric(float64(tokMean.Microseconds()), "tokenize-µs")
		b.ReportMetric(float64(p50)/float64(tokMean), "decide/tokenize")
	})
	b.Run("throughput", func(b *testing.B) {
		c := benchSystem(b)
		for i := range 32 {
			body, _ := benchBody("warm", i)
			exchange(b, c, body)
		}
		var mu sync.Mutex
		var lat []time.Duration
		b.ReportAllocs()
		b.ResetTimer()
		start := time.Now()
		var next int
		b.RunParallel(func(pb *testing.PB) {
			var mine []time.Duration
			for pb.Next() {
				mu.Lock()
				i := next
				next++
				mu.Unlock()
				body, _ := benchBody("throughput", i)
				mine = append(mine, exchange(b, c, body))
			}
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		})
		elapsed := time.Since(start)
		b.StopTimer()
		rps := float64(len(lat)) / elapsed.Seconds()
		b.ReportMetric(rps, "req/s")
		b.ReportMetric(rps/float64(runtime.GOMAXPROCS(0)), "req/s/core")
		b.ReportMetric(float64(quantile(lat, 0.99).Microseconds()), "p99-µs")
	})
	b.Run("paced-1000rps", func(b *testing.B) {
		// Open loop at 1,000 requests/s: each request starts on schedule
		// whether or not the previous ones finished.
		c := benchSystem(b)
		for i := range 32 {
			body, _ := benchBody("warm", i)
			exchange(b, c, body)
		}
		bodies := make([][]byte, b.N)
		for i := range bodies {
			bodies[i], _ = benchBody("paced", i)
		}
		lat := make([]time.Duration, b.N)
		var wg sync.WaitGroup
		b.ResetTimer()
		cpu0 := cpuTime()
		t0 := time.Now()
		for i := range b.N {
			if d := time.Until(t0.Add(time.Duration(i) * time.Millisecond)); d > 0 {
				time.Sleep(d) // pacing the offered load, not waiting for a condition
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				lat[i] = exchange(b, c, bodies[i])
			}()
		}
		wg.Wait()
		elapsed := time.Since(t0)
		cpu := cpuTime() - cpu0
		b.StopTimer()
		b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/req")
		// The tokenize-only baseline of the same bodies, after the paced
		// window (not during it: it would add its own load), so that the
		// ratio is side by side in one run.
		p50, tokMean := quantile(lat, 0.5), tokenize("paced", b.N)
		b.ReportMetric(float64(b.N)/elapsed.Seconds(), "req/s")
		b.ReportMetric(float64(p50.Microseconds()), "p50-µs")
		b.ReportMetric(float64(quantile(lat, 0.99).Microseconds()), "p99-µs")
		b.ReportMetric(float64(tokMean.Microseconds()), "tokenize-µs")
		b.ReportMetric(float64(p50)/float64(tokMean), "exchange/tokenize")
	})
}
