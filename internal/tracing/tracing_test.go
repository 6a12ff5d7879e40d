package tracing_test

import (
	"context"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/kvgate/kvgate/internal/tracing"
)

func TestOffByDefault(t *testing.T) {
	tp, err := tracing.Setup(context.Background(), tracing.Options{})
	if err != nil || tp != nil {
		t.Fatalf("Setup without an endpoint = %v, %v; want nil, nil (off)", tp, err)
	}
	if err := tp.Shutdown(context.Background()); err != nil {
		t.Errorf("Shutdown of the nil provider: %v", err)
	}
}

func TestSetupWithEndpoint(t *testing.T) {
	// The exporter connects lazily: an endpoint nobody listens on is no
	// error, and shutting down gives up within its context.
	tp, err := tracing.Setup(context.Background(), tracing.Options{Endpoint: "127.0.0.1:1", Insecure: true})
	if err != nil || tp == nil {
		t.Fatalf("Setup = %v, %v", tp, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_ = tp.Shutdown(ctx)
}

func TestNewExportsWithService(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := tracing.New(sdktrace.NewSimpleSpanProcessor(exp), tracing.Options{Service: "svc"})
	_, sp := tp.Tracer("t").Start(context.Background(), "s")
	sp.End()
	spans := exp.GetSpans() // before Shutdown, which empties the exporter
	defer func() {
		if err := tp.Shutdown(context.Background()); err != nil {
			t.Error(err)
		}
	}()
	if len(spans) != 1 {
		t.Fatalf("%d spans, want 1", len(spans))
	}
	found := false
	for _, a := range spans[0].Resource.Attributes() {
		if a.Key == "service.name" && a.Value.AsString() == "svc" {
			found = true
		}
	}
	if !found {
		t.Errorf("resource %v lacks service.name=svc", spans[0].Resource.Attributes())
	}
}
