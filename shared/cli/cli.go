// Package cli holds what every Sailplane binary's main needs: a logger chosen by flags and a
// context that ends on SIGINT/SIGTERM, so each main is only flag parsing and wiring.
package cli

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"sailplane.dev/shared/component"
	"sailplane.dev/shared/version"
)

// LogOptions are the logging flags shared by every binary.
type LogOptions struct {
	Level  string
	Format string
}

// AddFlags registers --log-level and --log-format.
func (o *LogOptions) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.Level, "log-level", "info",
		"log level: debug, info, warn, error or none, for every component or by component as in default:info,xds-server:debug,bus:warn (components: "+
			strings.Join(Components, ", ")+"; grpc is at warn unless named)")
	fs.StringVar(&o.Format, "log-format", "text", "log format: text or json, for every line the process logs (client-go's and grpc-go's included)")
}

// Logger builds the process logger; component loggers derive from it with .With("component", …)
// and follow the component's level (Levels). It becomes slog's default, so that lines of the
// standard log package (net/http's) take its format, and the libraries' own logs go to it:
// grpc-go's, and those RouteLibraryLogs names (client-go's, when the binary links it).
func (o *LogOptions) Logger() (*slog.Logger, error) {
	levels, err := ParseLevels(o.Level)
	if err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	// The handler lets every level through: levels decides.
	opts := &slog.HandlerOptions{Level: slog.Level(math.MinInt32)}
	var h slog.Handler
	switch strings.ToLower(o.Format) {
	case "text":
		h = slog.NewTextHandler(os.Stderr, opts)
	case "json":
		h = slog.NewJSONHandler(os.Stderr, opts)
	default:
		return nil, fmt.Errorf("--log-format: %q is neither text nor json", o.Format)
	}
	log := slog.New(levels.Handler(h))
	useProcessLogger(log, levels)
	return log, nil
}

// SignalContext is cancelled on SIGINT or SIGTERM, starting a graceful shutdown.
func SignalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
}

// Execute runs a binary's root command, with a `version` subcommand added (see
// shared/version; the root's name becomes the version's component). Errors are printed once, as
// "error: …", without the usage text (which only helps for flag mistakes, and cobra prints those
// itself), and exit 1.
func Execute(cmd *cobra.Command) {
	WithVersion(cmd)
	cmd.SilenceUsage, cmd.SilenceErrors = true, true
	if err := cmd.Execute(); err != nil {
		if log := processLogger.Load(); log != nil {
			log.Error("exiting", "error", err) // in the format asked for
		} else {
			fmt.Fprintln(os.Stderr, "error:", err)
		}
		os.Exit(1)
	}
}

// WithVersion adds the `version` subcommand to root (unless it has one) and names the binary's
// component after root, for the version its gRPC servers announce.
func WithVersion(root *cobra.Command) *cobra.Command {
	version.Component = root.Name()
	for _, c := range root.Commands() {
		if c.Name() == "version" {
			return root
		}
	}
	root.AddCommand(version.Command())
	return root
}

// RunUntilSignal runs the manager's components until SIGINT or SIGTERM.
func RunUntilSignal(m *component.Manager) error {
	ctx, stop := SignalContext()
	defer stop()
	return m.Run(ctx)
}

// EnvOr returns the environment variable's value, or def when it is unset or empty; flags use it
// for defaults that Kubernetes injects (POD_NAMESPACE, POD_NAME).
func EnvOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
