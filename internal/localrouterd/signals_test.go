package localrouterd

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/localrouter/client"
)

// vllmBusy is a metrics endpoint in vLLM's format whose rank 0 has a long
// queue: the seam replaced is the engine's /metrics, nothing else.
const vllmBusy = `# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 8
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 12
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.99
`

// TestEngineSignalsOverGRPC: a router scraping its workers' metrics skips
// the one whose engine reports saturation, says why in BestWorker's
// answer, shows the signals in PotentialLoads and Workers, and counts a
// worker whose endpoint fails without failing.
func TestEngineSignalsOverGRPC(t *testing.T) {
	t.Parallel() // its own etcd and NATS (newEnv)
	e := newEnv(t)
	busy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte(vllmBusy)) }))
	defer busy.Close()
	broken := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { http.Error(w, "no", http.StatusServiceUnavailable) }))
	defer broken.Close()

	cfg := e.config("signals")
	cfg.MetricsPeriod = 20 * time.Millisecond
	cfg.Router.SaturationWaiting = 10
	svc, c, _ := e.start(cfg)
	w1 := worker("w1")
	w1.Address = strings.TrimPrefix(busy.URL, "http://") // /metrics derived from the address
	w2 := worker("w2")
	w2.MetricsURL = broken.URL + "/metrics"
	e.putWorker("signals", w1, 0)
	e.putWorker("signals", w2, 0)
	waitWorkers(t, svc, "w1", "w2")

	ctx := testenv.Context(t)
	p := client.Prompt{Tokens: seqTokens(1, 64)}
	testenv.Eventually(t, testTimeout, func() (string, bool) {
		var rep client.SignalsReport
		sel, err := c.BestWorker(ctx, p, client.BestWorkerOptions{Signals: &rep})
		if err != nil {
			return err.Error(), false
		}
		if sel.WorkerID != "w2" || len(rep.Skipped) != 1 || rep.Skipped[0].Worker.ID != "w1" ||
			!strings.Contains(rep.Skipped[0].Reason, "12 requests waiting") {
			return testenv.Errorf("selection %+v, %+v: want w2, w1 skipped for its 12 waiting requests", sel, rep)
		}
		return "", true
	})
	loads, err := c.PotentialLoads(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range loads {
		switch l.Worker.ID {
		case "w1":
			if !l.HasEngine || l.Engine.Waiting != 12 || l.Engine.KVUsage != 0.99 || l.Saturation == "" {
				t.Errorf("w1 load %+v: want its engine signals and a saturation reason", l)
			}
		case "w2":
			if l.HasEngine {
				t.Errorf("w2 load %+v: its scrapes fail, want no engine signals", l)
			}
		}
	}
	ws, err := c.Workers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range ws {
		if got := w.GetRanks()[0].GetEngine(); (w.GetWorkerId() == "w1") != (got != nil) || (got != nil && got.GetEngine() != "vllm") {
			t.Errorf("worker %s rank 0 engine %v", w.GetWorkerId(), got)
		}
	}
	testenv.Eventually(t, testTimeout, func() (string, bool) {
		st, err := c.Stats(ctx)
		if err != nil {
			return err.Error(), false
		}
		return fmt.Sprintf("stats scrapes %d failures %d period %v", st.GetMetricsScrapes(), st.GetMetricsScrapeFailures(), st.GetConfig().GetMetricsPeriodSeconds()),
			st.GetMetricsScrapeFailures() > 0 && st.GetMetricsScrapes() > st.GetMetricsScrapeFailures() && st.GetConfig().GetMetricsPeriodSeconds() == 0.02
	})
}
