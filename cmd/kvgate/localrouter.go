package main

import (
	"context"
	"log/slog"
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
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	return server.Run(ctx, cfg, server.Deps{Logger: log})
}
