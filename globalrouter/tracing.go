package globalrouter

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/kvgate/kvgate/api/routing"
)

// Tracing: with WithTracerProvider, each decision is a span
// (kvgate.decide) continuing the trace of the request's traceparent
// header (Envoy's), with children kvgate.tokenize (tokenize and hash),
// one kvgate.probe per pool and kvgate.commit (ended when the local
// router answers the pipelined commit); the decision-latency histogram
// carries the trace id as an exemplar. Without a provider no span is
// started and nothing is allocated for tracing.

// WithTracerProvider traces decisions with tp (nil: off, the default).
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(o *options) { o.tracer = tp }
}

const tracerName = "github.com/kvgate/kvgate/globalrouter"

// headerCarrier reads a request's lower-cased headers for the propagator.
type headerCarrier map[string]string

func (h headerCarrier) Get(key string) string { return h[key] }
func (h headerCarrier) Set(key, value string) { h[key] = value }
func (h headerCarrier) Keys() []string {
	out := make([]string, 0, len(h))
	for k := range h {
		out = append(out, k)
	}
	return out
}

var traceContext = propagation.TraceContext{}

// startDecide starts the decision's span, the child of the request's
// traceparent when it has one (nil span: tracing off).
func (r *Router) startDecide(ctx context.Context, req *Request) (context.Context, trace.Span) {
	if r.tracer == nil {
		return ctx, nil
	}
	if req != nil && req.Headers["traceparent"] != "" {
		ctx = traceContext.Extract(ctx, headerCarrier(req.Headers))
	}
	ctx, sp := r.tracer.Start(ctx, "kvgate.decide", trace.WithSpanKind(trace.SpanKindServer))
	if req != nil {
		sp.SetAttributes(attribute.String("kvgate.model", req.Model), attribute.String("kvgate.request_id", req.ID))
	}
	return ctx, sp
}

// endDecide ends the decision's span with its outcome.
func endDecide(sp trace.Span, d *Decision, outcome string, err error) {
	if sp == nil {
		return
	}
	sp.SetAttributes(attribute.String("kvgate.outcome", outcome))
	if d != nil {
		sp.SetAttributes(attribute.String("kvgate.pool", d.Primary.Pool), attribute.String("kvgate.worker_id", d.Primary.WorkerID),
			attribute.Int("kvgate.overlap_blocks", d.Primary.OverlapBlocks), attribute.Int("kvgate.isl", d.ISL))
	}
	endSpan(sp, err)
}

// span starts a child span of ctx's (nil: tracing off).
func (r *Router) span(ctx context.Context, name string, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	if r.tracer == nil {
		return ctx, nil
	}
	return r.tracer.Start(ctx, name, trace.WithAttributes(attrs...))
}

// endSpan ends sp (nil: nothing), recording err.
func endSpan(sp trace.Span, err error, attrs ...attribute.KeyValue) {
	if sp == nil {
		return
	}
	sp.SetAttributes(attrs...)
	if err != nil {
		sp.RecordError(err)
		sp.SetStatus(codes.Error, err.Error())
	}
	sp.End()
}

// observeDecision records the decision latency, with the trace id as an
// exemplar when the decision is traced and sampled.
func (r *Router) observeDecision(outcome string, seconds float64, sp trace.Span) {
	o := r.m.decision.WithLabelValues(outcome)
	if sp != nil {
		if sc := sp.SpanContext(); sc.IsSampled() {
			if eo, ok := o.(prometheus.ExemplarObserver); ok {
				eo.ObserveWithExemplar(seconds, prometheus.Labels{"trace_id": sc.TraceID().String(), "span_id": sc.SpanID().String()})
				return
			}
		}
	}
	o.Observe(seconds)
}

// traced ends the commit's span sp when the local router answers, then
// calls next.
func traced(sp trace.Span, next func(routing.Selection, error)) func(routing.Selection, error) {
	if sp == nil {
		return next
	}
	return func(sel routing.Selection, err error) {
		endSpan(sp, err)
		next(sel, err)
	}
}
