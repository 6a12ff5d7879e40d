package app

import (
	"context"
	"log/slog"
	"os"

	"github.com/kvgate/kvgate/internal/localrouterd"
)

// runLocalRouter runs one pool's local router: flags and environment →
// localrouterd.Config → localrouterd.Run.
func runLocalRouter(ctx context.Context, args []string, x *extensions) error {
	cfg, err := localrouterd.ParseFlagsWith("localrouter", args, os.Getenv, os.Stderr, x.scorerRegistry())
	if err != nil {
		return err
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	return localrouterd.Run(ctx, cfg, localrouterd.Deps{Logger: log})
}
