package app

import (
	"context"
	"os"

	"github.com/kvgate/kvgate/internal/extprocd"
	"github.com/kvgate/kvgate/lib/config"
)

// runExtproc runs the global router as Envoy's ext_proc server: flags →
// extprocd.Options → extprocd.Run.
func runExtproc(ctx context.Context, args []string, x *extensions) error {
	o, err := extprocd.ParseFlags("extproc", args, os.Stderr)
	if err != nil {
		return err
	}
	log, err := config.Logging{Level: o.LogLevel, Format: o.LogFormat}.Logger(os.Stderr)
	if err != nil {
		return err // checked by ParseFlags
	}
	o.Policies, o.Scorers = x.policyRegistry(), x.scorerRegistry()
	return extprocd.Run(ctx, o, log)
}
