package app

import (
	"context"
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
	log, err := cfg.Log.Logger(os.Stderr)
	if err != nil {
		return err
	}
	return localrouterd.Run(ctx, cfg, localrouterd.Deps{Logger: log})
}
