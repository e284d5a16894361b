// Package cli holds what every Sailplane binary's main needs: a logger chosen by flags and a
// context that ends on SIGINT/SIGTERM, so each main is only flag parsing and wiring.
package cli

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/pflag"
)

// LogOptions are the logging flags shared by every binary.
type LogOptions struct {
	Level  string
	Format string
}

// AddFlags registers --log-level and --log-format.
func (o *LogOptions) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.Level, "log-level", "info", "log level: debug, info, warn, error")
	fs.StringVar(&o.Format, "log-format", "text", "log format: text or json")
}

// Logger builds the process logger; component loggers derive from it with .With("component", …).
func (o LogOptions) Logger() (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(o.Level)); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	opts := &slog.HandlerOptions{Level: level}
	switch strings.ToLower(o.Format) {
	case "text":
		return slog.New(slog.NewTextHandler(os.Stderr, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(os.Stderr, opts)), nil
	default:
		return nil, fmt.Errorf("--log-format: %q is neither text nor json", o.Format)
	}
}

// SignalContext is cancelled on SIGINT or SIGTERM, starting a graceful shutdown.
func SignalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
}
