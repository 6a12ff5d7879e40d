// Command kvgate is the one binary of the project: a KV-cache-aware router
// for LLM inference behind Envoy. Its subcommands are package app's
// (app.Main), which a program of its own can run with its own pool
// policies and worker scorers added (examples/custompolicy).
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/kvgate/kvgate/app"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := app.Main(ctx, os.Args[1:])
	stop()
	os.Exit(code)
}
