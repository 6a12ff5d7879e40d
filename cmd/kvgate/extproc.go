package main

import (
	"context"
	"log/slog"
	"os"

	"github.com/kvgate/kvgate/extproc"
)

// runExtproc runs the global router as Envoy's ext_proc server: flags →
// extproc.Options → extproc.Run.
func runExtproc(ctx context.Context, args []string) error {
	o, err := extproc.ParseFlags("extproc", args, os.Stderr)
	if err != nil {
		return err
	}
	var lvl slog.Level
	_ = lvl.UnmarshalText([]byte(o.LogLevel)) // checked by ParseFlags
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: lvl}))
	return extproc.Run(ctx, o, log)
}
