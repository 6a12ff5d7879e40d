package main

import (
	"context"
	"os"

	"github.com/kvgate/kvgate/extproc"
	"github.com/kvgate/kvgate/internal/config"
)

// runExtproc runs the global router as Envoy's ext_proc server: flags →
// extproc.Options → extproc.Run.
func runExtproc(ctx context.Context, args []string) error {
	o, err := extproc.ParseFlags("extproc", args, os.Stderr)
	if err != nil {
		return err
	}
	log, err := config.Logging{Level: o.LogLevel, Format: o.LogFormat}.Logger(os.Stderr)
	if err != nil {
		return err // checked by ParseFlags
	}
	return extproc.Run(ctx, o, log)
}
