package cli

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc/grpclog"
)

// processLogger is the logger Logger built: Execute reports a failed command with it, in the
// format asked for.
var processLogger atomic.Pointer[slog.Logger]

// processLevels are its levels (ProcessLogLevels).
var processLevels atomic.Pointer[Levels]

// ProcessLogLevels are the levels of the process logger (LogOptions.Logger), which the
// monitoring port serves so that they change without a restart; nil before Logger.
func ProcessLogLevels() *Levels { return processLevels.Load() }

var (
	librariesMu sync.Mutex
	libraries   = map[string]func(*slog.Logger){}
)

// RouteLibraryLogs has route send a library's own logs to the process logger, as component
// (one of Components), once Logger has built it. The package that links the library registers
// it from an init function, so that a binary links only the libraries it uses: shared/kube
// routes client-go's klog.
func RouteLibraryLogs(component string, route func(*slog.Logger)) {
	librariesMu.Lock()
	defer librariesMu.Unlock()
	libraries[component] = route
}

// useProcessLogger makes log the process's: slog's default (and so the standard log package's),
// grpc-go's, and the registered libraries'.
func useProcessLogger(log *slog.Logger, levels *Levels) {
	processLogger.Store(log)
	processLevels.Store(levels)
	slog.SetDefault(log)
	grpclog.SetLoggerV2(grpcLogger{log.With("component", "grpc")})
	librariesMu.Lock()
	defer librariesMu.Unlock()
	for component, route := range libraries {
		route(log.With("component", component))
	}
}

// grpcLogger is grpc-go's logger (grpclog.LoggerV2) writing to a slog.Logger; its verbose logs
// (V(2), …) are Debug.
type grpcLogger struct{ log *slog.Logger }

var _ grpclog.LoggerV2 = grpcLogger{}

func (g grpcLogger) print(level slog.Level, msg func() string) {
	if ctx := context.Background(); g.log.Enabled(ctx, level) {
		g.log.Log(ctx, level, msg())
	}
}

func (g grpcLogger) Info(args ...any)      { g.print(slog.LevelInfo, sprint(args)) }
func (g grpcLogger) Infoln(args ...any)    { g.Info(args...) }
func (g grpcLogger) Warning(args ...any)   { g.print(slog.LevelWarn, sprint(args)) }
func (g grpcLogger) Warningln(args ...any) { g.Warning(args...) }
func (g grpcLogger) Error(args ...any)     { g.print(slog.LevelError, sprint(args)) }
func (g grpcLogger) Errorln(args ...any)   { g.Error(args...) }
func (g grpcLogger) Fatal(args ...any)     { g.Error(args...); os.Exit(1) }
func (g grpcLogger) Fatalln(args ...any)   { g.Fatal(args...) }

func (g grpcLogger) Infof(format string, args ...any) { g.print(slog.LevelInfo, sprintf(format, args)) }
func (g grpcLogger) Warningf(format string, args ...any) {
	g.print(slog.LevelWarn, sprintf(format, args))
}
func (g grpcLogger) Errorf(format string, args ...any) {
	g.print(slog.LevelError, sprintf(format, args))
}
func (g grpcLogger) Fatalf(format string, args ...any) { g.Errorf(format, args...); os.Exit(1) }

// sprint and sprintf format only when the line is logged.
func sprint(args []any) func() string { return func() string { return fmt.Sprint(args...) } }
func sprintf(format string, args []any) func() string {
	return func() string { return fmt.Sprintf(format, args...) }
}

// V reports whether grpc-go's verbosity l is on: 0 at Info, more at Debug.
func (g grpcLogger) V(l int) bool {
	if l <= 0 {
		return g.log.Enabled(context.Background(), slog.LevelInfo)
	}
	return g.log.Enabled(context.Background(), slog.LevelDebug)
}
