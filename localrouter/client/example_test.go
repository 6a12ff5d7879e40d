package client_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/kvgate/kvgate/api/routing"
	"github.com/kvgate/kvgate/localrouter"
	"github.com/kvgate/kvgate/localrouter/client"
)

// Automatic routing: Generate picks the worker with the best cost (here
// the one holding most of the prompt), streams the completion from its
// /v1/completions, and keeps the router's view of the request up to date.
func ExampleClient_Generate() {
	p := startPool("w1", "w2")
	defer p.stop()
	tokens := prompt(0, 64)
	p.cache("w2", tokens, 3) // w2 holds 3 of the 4 blocks

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := client.Dial(p.addr, nil)
	if err != nil {
		panic(err)
	}
	defer c.Close()

	stream, err := c.Generate(ctx, tokens, "demo", client.GenerateOptions{MaxTokens: 16})
	if err != nil {
		panic(err)
	}
	defer stream.Close()
	var text strings.Builder
	for {
		chunk, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			panic(err)
		}
		text.WriteString(chunk.Text)
	}
	sel := stream.Selection()
	fmt.Printf("%s (%d of %d blocks cached): %s\n", sel.WorkerID, sel.OverlapBlocks, sel.RequestBlocks, text.String())
	// Output: w2 (3 of 4 blocks cached): Hello from w2
}

// Manual lifecycle: BestWorker with a request id records the request on the
// chosen worker; the caller runs it there itself, then reports the first
// token and the end.
func ExampleClient_BestWorker() {
	p := startPool("w1", "w2")
	defer p.stop()
	tokens := prompt(0, 64)
	p.cache("w1", tokens, 4)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := client.Dial(p.addr, nil)
	if err != nil {
		panic(err)
	}
	defer c.Close()

	sel, err := c.BestWorker(ctx, client.TokenPrompt(tokens), client.BestWorkerOptions{RequestID: "req-42"})
	if err != nil {
		panic(err)
	}
	fmt.Printf("run req-42 on %s: %d blocks cached\n", sel.WorkerID, sel.OverlapBlocks)
	// … send the request to sel.Address; at its first token:
	if err := c.MarkPrefillComplete(ctx, "req-42"); err != nil {
		panic(err)
	}
	// … at its end (or on error):
	if err := c.Free(ctx, "req-42"); err != nil {
		panic(err)
	}
	ws, _ := c.Workers(ctx)
	for _, w := range ws {
		fmt.Printf("%s: %d active\n", w.GetWorkerId(), w.GetRanks()[0].GetActiveRequests())
	}
	// Output:
	// run req-42 on w1: 4 blocks cached
	// w1: 0 active
	// w2: 0 active
}

// Hierarchical probing: ask several pools' routers for their best worker
// without a request id (nothing changes in any of them), pick the pool
// with the most cached blocks, and commit there. This is what the global
// router does across pools, with block hashes on the wire.
func Example_hierarchicalProbing() {
	a, b := startPool("a1", "a2"), startPool("b1", "b2")
	defer a.stop()
	defer b.stop()
	tokens := prompt(0, 128)
	a.cache("a1", tokens, 2)
	b.cache("b2", tokens, 6)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var best *client.Client
	var bestSel routing.Selection
	for _, addr := range []string{a.addr, b.addr} {
		c, err := client.Dial(addr, nil)
		if err != nil {
			panic(err)
		}
		defer c.Close()
		sel, err := c.BestWorker(ctx, client.TokenPrompt(tokens), client.BestWorkerOptions{})
		if err != nil {
			continue // a pool that fails is skipped
		}
		fmt.Printf("probe: %s would hold %d blocks\n", sel.WorkerID, sel.OverlapBlocks)
		if best == nil || sel.OverlapBlocks > bestSel.OverlapBlocks {
			best, bestSel = c, sel
		}
	}
	// Commit on the chosen pool, tracked: closing the tracker frees it.
	tr, err := best.Track(ctx, "req-7", localrouter.Selected(bestSel), client.TokenPrompt(tokens))
	if err != nil {
		panic(err)
	}
	fmt.Printf("committed to %s\n", tr.Selection().WorkerID)
	_ = tr.PrefillComplete()
	_ = tr.Free()
	// Output:
	// probe: a1 would hold 2 blocks
	// probe: b2 would hold 6 blocks
	// committed to b2
}

// Custom routing: read every worker's potential load and choose by your
// own rule (here: fewest prefill tokens, to minimise time to first token),
// then Generate on that worker.
func ExampleClient_PotentialLoads() {
	p := startPool("w1", "w2", "w3")
	defer p.stop()
	tokens := prompt(0, 64)
	p.cache("w3", tokens, 4)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := client.Dial(p.addr, nil)
	if err != nil {
		panic(err)
	}
	defer c.Close()

	loads, err := c.PotentialLoads(ctx, client.TokenPrompt(tokens))
	if err != nil {
		panic(err)
	}
	best := loads[0]
	for _, l := range loads {
		fmt.Printf("%s: %d prefill tokens\n", l.Worker.ID, l.PotentialPrefillTokens)
		if l.PotentialPrefillTokens < best.PotentialPrefillTokens {
			best = l
		}
	}
	stream, err := c.Generate(ctx, tokens, "demo", client.GenerateOptions{Worker: &best.Worker})
	if err != nil {
		panic(err)
	}
	defer stream.Close()
	for {
		chunk, err := stream.Recv()
		if err != nil {
			break
		}
		fmt.Print(chunk.Text)
	}
	fmt.Println()
	// Output:
	// w1: 64 prefill tokens
	// w2: 64 prefill tokens
	// w3: 0 prefill tokens
	// Hello from w3
}
