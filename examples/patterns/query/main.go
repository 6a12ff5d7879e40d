// Command query asks a running local router (kvgate localrouter) the
// questions a caller asks, with the Go client, and prints the answers as
// JSON: its workers, the best worker for a prompt (a pure query, nothing
// recorded), every worker's potential load, and its stats. With -commit it
// also records the prompt as a request, marks its prefill complete and
// frees it: the manual lifecycle.
//
//	go run ./examples/patterns/query -router 127.0.0.1:7100 -tokens 256
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/kvgate/kvgate/localrouter"
	"github.com/kvgate/kvgate/localrouter/client"
)

func main() {
	router := flag.String("router", "127.0.0.1:7100", "local router gRPC address")
	n := flag.Int("tokens", 256, "prompt length: token ids 0..n-1")
	commit := flag.Bool("commit", false, "also record, prefill-complete and free the prompt as request query-1")
	flag.Parse()
	if err := run(*router, *n, *commit); err != nil {
		fmt.Fprintln(os.Stderr, "query:", err)
		os.Exit(1)
	}
}

func run(addr string, n int, commit bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := client.Dial(addr, nil)
	if err != nil {
		return err
	}
	defer c.Close()
	tokens := make([]uint32, n)
	for i := range tokens {
		tokens[i] = uint32(i)
	}
	p := client.TokenPrompt(tokens)

	workers, err := c.Workers(ctx)
	if err != nil {
		return fmt.Errorf("workers: %w", err)
	}
	show("workers", workers)
	sel, err := c.BestWorker(ctx, p, client.BestWorkerOptions{})
	if err != nil {
		return fmt.Errorf("BestWorker: %w", err)
	}
	show("best worker", sel)
	loads, err := c.PotentialLoads(ctx, p)
	if err != nil {
		return fmt.Errorf("PotentialLoads: %w", err)
	}
	show("potential loads", loads)
	if commit {
		sel, err := c.BestWorker(ctx, p, client.BestWorkerOptions{RequestID: "query-1"})
		if err != nil {
			return fmt.Errorf("BestWorker with a request id: %w", err)
		}
		show("recorded query-1 on", localrouter.Selected(sel))
		if err := c.MarkPrefillComplete(ctx, "query-1"); err != nil {
			return err
		}
		if err := c.Free(ctx, "query-1"); err != nil {
			return err
		}
	}
	stats, err := c.Stats(ctx)
	if err != nil {
		return fmt.Errorf("stats: %w", err)
	}
	show("stats", stats)
	return nil
}

func show(what string, v any) {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		b = []byte(err.Error())
	}
	fmt.Printf("%s:\n%s\n", what, b)
}
