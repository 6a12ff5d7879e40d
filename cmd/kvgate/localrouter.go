package main

import (
	"context"
	"log/slog"
	"os"

	"github.com/kvgate/kvgate/internal/localrouterd"
)

// runLocalRouter runs one pool's local router: flags and environment →
// localrouterd.Config → localrouterd.Run.
func runLocalRouter(ctx context.Context, args []string) error {
	cfg, err := localrouterd.ParseFlags("localrouter", args, os.Getenv, os.Stderr)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	return localrouterd.Run(ctx, cfg, localrouterd.Deps{Logger: log})
}
