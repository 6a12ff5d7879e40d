package server_test

import (
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	localrouterv1 "github.com/kvgate/kvgate/api/localrouter/v1"
	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/localrouter"
	"github.com/kvgate/kvgate/localrouter/signals"
	"github.com/kvgate/kvgate/pool/pooltest"
)

// Workers answers each rank's timing model: the prior before any sample,
// a pinned model as pinned.
func TestWorkersReportCalibration(t *testing.T) {
	ctx := testenv.Context(t)
	srv := pooltest.Start(t, "p", 16, pooltest.Workers("w", 2)...)
	slow := localrouter.TimingModelOf(func(t int) float64 { return 2 * (4.21e-7*float64(t*t) + 0.01518*float64(t) + 16.5) },
		func(p float64) float64 { return 10 + 20*p }, localrouter.DefaultTTFTChunk)
	if err := srv.Router.PinTiming(localrouter.WorkerKey{ID: "w-1"}, slow); err != nil {
		t.Fatal(err)
	}
	// w-0's engine reports its time to first token histogram twice: two
	// first tokens of 250 ms in between, which the lifecycle did not see
	// (and no placement awaits: no sample, but the interval's mean).
	at := time.Unix(1000, 0)
	for _, h := range []signals.HistogramTotals{{Sum: 1, Count: 4, Has: true}, {Sum: 1.5, Count: 6, Has: true}} {
		srv.Router.SetEngineSignals("w-0", map[uint32]signals.Sample{0: {Engine: signals.EngineVLLM, TTFT: h, At: at}})
	}
	conn, err := grpc.NewClient(srv.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	resp, err := localrouterv1.NewLocalRouterClient(conn).Workers(ctx, &localrouterv1.WorkersRequest{})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]*localrouterv1.Calibration{}
	for _, w := range resp.GetWorkers() {
		for _, r := range w.GetRanks() {
			got[w.GetWorkerId()] = r.GetCalibration()
		}
	}
	if c := got["w-0"]; c.GetSource() != "prior" || c.GetMinSamples() != localrouter.CalibrationMinSamples || c.GetSpeed() != 1 ||
		c.GetPrefillChunkMs() < 169 || c.GetPrefillChunkMs() > 169.2 || !c.GetHistograms() || c.GetEngineTtftMs() != 250 || c.GetHistogramSamples() != 0 {
		t.Errorf("w-0: %v, want the prior (169.1 ms a chunk), speed 1, histograms scraped (250 ms TTFT, no sample)", c)
	}
	if c := got["w-1"]; c.GetSource() != "pinned" || c.GetPrefillChunkMs() < 338 || c.GetPrefillChunkMs() > 338.4 || c.GetDecodeFixed() != 10 {
		t.Errorf("w-1: %v, want the pinned model (338.2 ms a chunk, decode 10 ms empty)", c)
	}
}
