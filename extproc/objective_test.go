package extproc_test

import (
	"context"
	"errors"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/envoy/extprocclient"
	"github.com/kvgate/kvgate/extproc"
	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/pool/pooltest"
)

// gieObjectives is the Inference Extension's own example objectives
// (v1.0.0 config/manifests/inferenceobjective.yaml, vendored): food-review
// priority 1, base-model and base-model-cpu priority 2, all of the pool
// vllm-llama3-8b-instruct.
var gieObjectives = filepath.Join("..", "globalrouter", "flowcontrol", "testdata", "gie-v1.0.0", "inferenceobjective.yaml")

// objectiveRouter is flowRouter with the GIE example's objectives.
func objectiveRouter(t *testing.T, access globalrouter.Access) (*globalrouter.Router, *pooltest.Server) {
	t.Helper()
	return flowRouter(t, time.Minute, func(cfg *globalrouter.Config) {
		cfg.Trust.Objectives = access
		cfg.FlowControl.ObjectivesFile, cfg.FlowControl.InferencePool = gieObjectives, "vllm-llama3-8b-instruct"
	})
}

// bands is each band's waiting requests, "high 1, default 2".
func bands(r *globalrouter.Router) string {
	var out []string
	for _, q := range r.FlowQueues() {
		for _, b := range q.Bands {
			out = append(out, b.Name+" "+itoa(b.Requests))
		}
	}
	return strings.Join(out, ", ")
}

// routedCh reads s until it is routed (its upstream headers), then sends
// it on ch.
func routedCh(ctx context.Context, name string, s *extprocclient.Stream, ch chan<- string) {
	for {
		f, err := s.ReadUpstream(ctx)
		if err == nil && f.Kind == extprocclient.FrameHeaders || errors.Is(err, io.EOF) {
			ch <- name
			return
		}
		if err != nil {
			ch <- name + ": " + err.Error()
			return
		}
	}
}

// TestObjectivePriorityThroughExtProc: requests naming the GIE example's
// InferenceObjectives in x-gateway-inference-objective wait in the band of
// the objective's priority; food-review (priority 1) overtakes a default
// request that waited before it; an objective not configured is priority
// 0 (the endpoint picker's default); x-kvgate-priority, when honoured,
// wins over the objective.
func TestObjectivePriorityThroughExtProc(t *testing.T) {
	ctx := testenv.Context(t)
	r, lr := objectiveRouter(t, "")
	conn, _ := startServer(t, extproc.Config{}, r)
	c := envoyClient(t, conn, allModes[1])

	a, _ := routed(t, ctx, c, tokenBody(200, 0)) // the worker is busy prefilling
	if err := lr.WaitActive(ctx, 1); err != nil {
		t.Fatal(err)
	}
	got := make(chan string, 4)
	streams := map[string]*extprocclient.Stream{}
	send := func(name string, base int, want string, h ...extprocclient.HeaderField) {
		s := open(t, ctx, c, tokenBody(200, base), h...)
		streams[name] = s
		go routedCh(ctx, name, s, got)
		testenv.Eventually(t, 20*time.Second, func() (string, bool) {
			b := bands(r)
			return "after " + name + ": got " + b + ", want " + want, b == want
		})
	}
	obj := func(name string) extprocclient.HeaderField {
		return extprocclient.HeaderField{Key: globalrouter.HeaderObjective, Value: name}
	}
	send("plain", 1000, "high 0, default 1", extprocclient.HeaderField{Key: "x-tenant", Value: "b"})
	send("food-review", 2000, "high 1, default 1", obj("food-review"))
	send("unknown objective", 3000, "high 1, default 2", obj("no-such-objective"))
	send("priority header wins", 4000, "high 1, default 3", obj("base-model"), extprocclient.HeaderField{Key: globalrouter.HeaderPriority, Value: "0"})

	respond(t, ctx, a, "200", "application/json", `{}`) // room for one: the high band's
	if first := <-got; first != "food-review" {
		t.Fatalf("first routed after the worker freed: got %q, want food-review (priority 1 from its objective)", first)
	}
	// food-review's prompt fills the worker again: the default band waits.
	if b := bands(r); b != "high 0, default 3" {
		t.Errorf("after food-review went: got %s, want high 0, default 3", b)
	}
	respond(t, ctx, streams["food-review"], "200", "application/json", `{}`)
	for range 3 {
		name := <-got
		s, ok := streams[name]
		if !ok {
			t.Fatalf("routed: %s", name)
		}
		respond(t, ctx, s, "200", "application/json", `{}`)
	}
	if err := lr.WaitIdle(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestObjectiveTrusted: with trust.objectives trusted, a caller without
// the trust token naming an objective is answered 403; one naming none
// is routed.
func TestObjectiveTrusted(t *testing.T) {
	ctx := testenv.Context(t)
	r, lr := objectiveRouter(t, globalrouter.AccessTrusted)
	conn, _ := startServer(t, extproc.Config{}, r)
	c := envoyClient(t, conn, allModes[1])

	s := open(t, ctx, c, tokenBody(20, 0), extprocclient.HeaderField{Key: globalrouter.HeaderObjective, Value: "food-review"})
	for {
		_, err := s.ReadUpstream(ctx)
		if errors.Is(err, extprocclient.ErrLocalReply) {
			break
		}
		if err != nil {
			t.Fatalf("got %v, want a local reply", err)
		}
	}
	if rep := s.Info().LocalReply; rep.Status != 403 || !strings.Contains(string(rep.Body), globalrouter.HeaderObjective) {
		t.Errorf("untrusted objective: got %d %s, want 403 naming %s", rep.Status, rep.Body, globalrouter.HeaderObjective)
	}
	a, _ := routed(t, ctx, c, tokenBody(20, 100))
	respond(t, ctx, a, "200", "application/json", `{}`)
	if err := lr.WaitIdle(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestObjectiveNotSentUpstream: the routed request reaches the worker
// without x-gateway-inference-objective, as the Inference Extension's
// endpoint picker strips it once read (GIE v1.0.0
// pkg/epp/handlers/request.go); the objective still chose the band.
func TestObjectiveNotSentUpstream(t *testing.T) {
	ctx := testenv.Context(t)
	r, lr := objectiveRouter(t, "")
	conn, _ := startServer(t, extproc.Config{}, r)
	c := envoyClient(t, conn, allModes[1])

	s, h := routed(t, ctx, c, tokenBody(20, 0), extprocclient.HeaderField{Key: globalrouter.HeaderObjective, Value: "food-review"})
	if v, ok := h.Get(globalrouter.HeaderObjective); ok {
		t.Errorf("upstream headers carry %s: %q; want it stripped", globalrouter.HeaderObjective, v)
	}
	respond(t, ctx, s, "200", "application/json", `{}`)
	if err := lr.WaitIdle(ctx); err != nil {
		t.Fatal(err)
	}
}
