package main

import (
	"context"
	"os"

	"github.com/kvgate/kvgate/localrouter/server"
)

// runLocalRouter runs one pool's local router: flags and environment →
// server.Config → server.Run.
func runLocalRouter(ctx context.Context, args []string) error {
	cfg, err := server.ParseFlags("localrouter", args, os.Getenv, os.Stderr)
	if err != nil {
		return err
	}
	log, err := cfg.Log.Logger(os.Stderr)
	if err != nil {
		return err
	}
	return server.Run(ctx, cfg, server.Deps{Logger: log})
}
