package app

import (
	"context"
	"log/slog"
	"os"

	"github.com/kvgate/kvgate/internal/extprocd"
)

// runExtproc runs the global router as Envoy's ext_proc server: flags →
// extprocd.Options → extprocd.Run.
func runExtproc(ctx context.Context, args []string, x *extensions) error {
	o, err := extprocd.ParseFlags("extproc", args, os.Stderr)
	if err != nil {
		return err
	}
	var lvl slog.Level
	_ = lvl.UnmarshalText([]byte(o.LogLevel)) // checked by ParseFlags
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: lvl}))
	o.Policies, o.Scorers = x.policyRegistry(), x.scorerRegistry()
	return extprocd.Run(ctx, o, log)
}
