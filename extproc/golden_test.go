package extproc_test

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/expfmt"

	"github.com/kvgate/kvgate/envoy/extprocclient"
	"github.com/kvgate/kvgate/extproc"
	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/internal/testenv"
)

var update = flag.Bool("update", false, "rewrite testdata golden files")

// TestMetricsGolden checks the exposition of the metrics whose values do
// not depend on timing, after one routed streamed request and one refused.
func TestMetricsGolden(t *testing.T) {
	d := &deciderDouble{decide: func(req *globalrouter.Request) (*globalrouter.Decision, error) {
		if req.Model == "nope" {
			return nil, globalrouter.ErrUnknownModel
		}
		return fixedDecision(), nil
	}}
	conn, reg := startServer(t, extproc.Config{}, d)
	c := envoyClient(t, conn, allModes[1])
	for _, model := range []string{"m1", "nope"} {
		if _, err := c.Process(testenv.Context(t), extprocclient.Request{
			Message:  extprocclient.Message{Headers: post("/v1/completions"), Body: [][]byte{[]byte(`{"model":"` + model + `","prompt":"hi"}`)}},
			Upstream: sseResponse(sseChunks...),
		}); err != nil {
			t.Fatal(err)
		}
	}
	names := []string{"kvgate_extproc_requests_total", "kvgate_extproc_overlap_blocks", "kvgate_extproc_tokens_total", "kvgate_extproc_streams_active"}
	// The last stream's end is seen by the server after the client returns.
	testenv.Eventually(t, testCtxTimeout, func() (string, bool) {
		mfs, err := reg.Gather()
		if err != nil {
			return err.Error(), false
		}
		for _, mf := range mfs {
			if mf.GetName() == "kvgate_extproc_streams_active" {
				v := mf.GetMetric()[0].GetGauge().GetValue()
				return "streams still active", v == 0
			}
		}
		return "no streams gauge", false
	})
	golden := filepath.Join("testdata", "metrics.golden")
	if *update {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		for _, mf := range mfs {
			if slices.Contains(names, mf.GetName()) {
				if _, err := expfmt.MetricFamilyToText(&buf, mf); err != nil {
					t.Fatal(err)
				}
			}
		}
		if err := os.WriteFile(golden, buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	f, err := os.Open(golden)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := testutil.GatherAndCompare(reg, f, names...); err != nil {
		t.Errorf("metrics differ from %s (run with -update to accept):\n%v", golden, err)
	}
}
