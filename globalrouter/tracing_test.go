package globalrouter_test

import (
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	dto "github.com/prometheus/client_model/go"

	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/internal/tracing"
	"github.com/kvgate/kvgate/tokenizer"
)

const (
	envoyTraceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	envoySpanID  = "00f067aa0ba902b7"
)

// TestTracing: a decision is a span continuing Envoy's traceparent, with
// a tokenize span, one probe span per pool and a commit span; the
// decision-latency histogram carries the trace id as an exemplar.
func TestTracing(t *testing.T) {
	ctx := testenv.Context(t)
	c := newCluster(t)
	exp := tracetest.NewInMemoryExporter()
	tp := tracing.New(sdktrace.NewSimpleSpanProcessor(exp), tracing.Options{Service: "test"})
	t.Cleanup(func() { _ = tp.Shutdown(ctx) })
	r, reg := newRouter(t, c.cfg, globalrouter.WithTracerProvider(tp))

	d, err := r.Decide(ctx, &globalrouter.Request{ID: "traced", Model: model, Chat: tokenizer.NewChat(chat("hello")...),
		Headers: map[string]string{"traceparent": "00-" + envoyTraceID + "-" + envoySpanID + "-01"}})
	if err != nil {
		t.Fatal(err)
	}
	defer free(t, d)
	// The commit span ends when the local router answers the pipelined
	// commit.
	byName := map[string][]tracetest.SpanStub{}
	waitFor(ctx, t, "the commit span", func() bool {
		byName = map[string][]tracetest.SpanStub{}
		for _, s := range exp.GetSpans() {
			byName[s.Name] = append(byName[s.Name], s)
		}
		return len(byName["kvgate.commit"]) == 1
	})
	if n := len(byName["kvgate.decide"]); n != 1 {
		t.Fatalf("%d decide spans, want 1 (spans: %v)", n, byName)
	}
	dec := byName["kvgate.decide"][0]
	if got := dec.SpanContext.TraceID().String(); got != envoyTraceID {
		t.Errorf("decide span's trace %s, want Envoy's %s", got, envoyTraceID)
	}
	if got := dec.Parent.SpanID().String(); got != envoySpanID || !dec.Parent.IsRemote() {
		t.Errorf("decide span's parent %s (remote %v), want Envoy's span %s", got, dec.Parent.IsRemote(), envoySpanID)
	}
	attrs := map[string]string{}
	for _, a := range dec.Attributes {
		attrs[string(a.Key)] = a.Value.String()
	}
	if attrs["kvgate.outcome"] != "ok" || attrs["kvgate.pool"] != d.Primary.Pool || attrs["kvgate.request_id"] != "traced" {
		t.Errorf("decide span attributes %v", attrs)
	}
	for name, want := range map[string]int{"kvgate.tokenize": 1, "kvgate.probe": 2, "kvgate.commit": 1} {
		spans := byName[name]
		if len(spans) != want {
			t.Errorf("%d %s spans, want %d", len(spans), name, want)
		}
		for _, s := range spans {
			if s.Parent.SpanID() != dec.SpanContext.SpanID() {
				t.Errorf("%s span is not the decide span's child", name)
			}
		}
	}
	pools := map[string]bool{}
	for _, s := range byName["kvgate.probe"] {
		for _, a := range s.Attributes {
			if a.Key == "kvgate.pool" {
				pools[a.Value.AsString()] = true
			}
		}
	}
	if !pools["pool-a"] || !pools["pool-b"] {
		t.Errorf("probe spans for pools %v, want pool-a and pool-b", pools)
	}

	// The exemplar.
	if !hasExemplar(t, reg, envoyTraceID) {
		t.Error("no exemplar with the trace id on kvgate_globalrouter_decision_duration_seconds")
	}
}

func TestTracingOff(t *testing.T) {
	ctx := testenv.Context(t)
	c := newCluster(t)
	r, reg := newRouter(t, c.cfg)
	d, err := r.Decide(ctx, &globalrouter.Request{Model: model, Prompt: "hi",
		Headers: map[string]string{"traceparent": "00-" + envoyTraceID + "-" + envoySpanID + "-01"}})
	if err != nil {
		t.Fatal(err)
	}
	free(t, d)
	if hasExemplar(t, reg, envoyTraceID) {
		t.Error("an exemplar without tracing")
	}
}

func hasExemplar(t *testing.T, reg interface {
	Gather() ([]*dto.MetricFamily, error)
}, traceID string) bool {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "kvgate_globalrouter_decision_duration_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, b := range m.GetHistogram().GetBucket() {
				for _, l := range b.GetExemplar().GetLabel() {
					if l.GetName() == "trace_id" && l.GetValue() == traceID {
						return true
					}
				}
			}
		}
	}
	return false
}
