package config

import (
	"fmt"
	"io"
	"log/slog"
)

// Log formats: every subcommand logs in one format, JSON lines unless
// -log-format text says otherwise.
const (
	LogJSON = "json"
	LogText = "text"
)

// Logging is a process's log configuration: -log-level and -log-format,
// the same flags on every subcommand.
type Logging struct {
	Level  string // debug, info, warn or error
	Format string // json or text
}

// Flags defines -log-level (default level) and -log-format on fs.
func (l *Logging) Flags(fs *FlagSet, level string) {
	if l.Level == "" {
		l.Level = level
	}
	if l.Format == "" {
		l.Format = LogJSON
	}
	fs.StringVar(&l.Level, "log-level", l.Level, "debug, info, warn or error (logs go to stderr)")
	fs.StringVar(&l.Format, "log-format", l.Format, "json (one object a line, as every kvgate subcommand logs by default) or text")
}

// Validate reports a level or format that is not one.
func (l Logging) Validate() error {
	_, err := l.Logger(io.Discard)
	return err
}

// Logger is a logger writing to w at the configured level and format.
func (l Logging) Logger(w io.Writer) (*slog.Logger, error) {
	var lvl slog.Level
	if l.Level != "" {
		if err := lvl.UnmarshalText([]byte(l.Level)); err != nil {
			return nil, fmt.Errorf("-log-level: %w", err)
		}
	}
	opts := &slog.HandlerOptions{Level: lvl}
	switch l.Format {
	case LogJSON, "":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	case LogText:
		return slog.New(slog.NewTextHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("-log-format %q: want %s or %s", l.Format, LogJSON, LogText)
}
