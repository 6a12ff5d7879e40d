// Package tracing sets up OpenTelemetry tracing for kvgate's processes:
// an OTLP/gRPC exporter to the collector at -otlp-endpoint, batched, with
// W3C trace-context propagation (Envoy's traceparent header). Tracing is
// off by default: without an endpoint Setup returns nil and the routers
// start no span.
package tracing

import (
	"context"
	"errors"
	"fmt"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// Options configure Setup.
type Options struct {
	// Endpoint is the OTLP/gRPC collector's host:port ("" : tracing off).
	Endpoint string
	// Insecure sends without TLS (a collector on localhost or a sidecar).
	Insecure bool
	// Service is the service.name resource attribute (default "kvgate").
	Service string
	// SampleRatio is the share of root traces sampled (default 1); a trace
	// Envoy started keeps Envoy's sampling decision.
	SampleRatio float64
}

// Provider is a tracer provider with its shutdown.
type Provider struct {
	trace.TracerProvider
	shutdown func(context.Context) error
}

// Shutdown flushes the spans still batched and stops the exporter.
func (p *Provider) Shutdown(ctx context.Context) error {
	if p == nil || p.shutdown == nil {
		return nil
	}
	return p.shutdown(ctx)
}

// Setup builds the provider of o, or returns nil (tracing off) when
// o.Endpoint is empty. The exporter connects lazily: an unreachable
// collector drops spans, it never blocks a request.
func Setup(ctx context.Context, o Options) (*Provider, error) {
	if o.Endpoint == "" {
		return nil, nil
	}
	opts := []otlptracegrpc.Option{otlptracegrpc.WithEndpoint(o.Endpoint)}
	if o.Insecure {
		opts = append(opts, otlptracegrpc.WithInsecure())
	}
	exp, err := otlptracegrpc.New(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("otlp exporter %s: %w", o.Endpoint, err)
	}
	return New(sdktrace.NewBatchSpanProcessor(exp), o), nil
}

// New builds a provider over processor sp (tests pass a
// sdktrace.NewSimpleSpanProcessor of a tracetest.InMemoryExporter).
func New(sp sdktrace.SpanProcessor, o Options) *Provider {
	if o.Service == "" {
		o.Service = "kvgate"
	}
	ratio := o.SampleRatio
	if ratio <= 0 || ratio > 1 {
		ratio = 1
	}
	// Schemaless: merging never conflicts with the SDK's schema URL.
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(attribute.String("service.name", o.Service)))
	if err != nil {
		res = resource.Default()
	}
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithSpanProcessor(sp),
		sdktrace.WithResource(res),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(ratio))),
	)
	return &Provider{TracerProvider: tp, shutdown: func(ctx context.Context) error {
		return errors.Join(tp.Shutdown(ctx))
	}}
}

// Propagator is the W3C trace-context propagator (traceparent,
// tracestate), as Envoy sends it.
func Propagator() propagation.TextMapPropagator { return propagation.TraceContext{} }
