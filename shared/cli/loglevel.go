package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
)

// Components are the values of the "component" attribute that Sailplane's loggers carry (each
// service's logger, and the parts that derive their own from it), which --log-level may name.
// TestComponentsListed keeps the list true.
var Components = []string{
	// Services, and the process's shared parts.
	"agent", "ca", "config-ingest", "endpoint-watcher", "webhook", "xds-server",
	"bus", "bus-server", "ca-bus", "config-bus", "registry-bus", "certificate", "monitoring",
	// Parts of a service.
	"admission", "ads", "capture", "cni-install", "cni-repair", "credentials", "dns-proxy", "envoygen", "gateway-deploy", "gateway-status", "grpcgen", "inject", "jwks", "rebalance", "revision-tags", "upstream",
	// Libraries' own logs: grpc-go's (Warn and above unless named), client-go's (klog).
	"grpc", "klog",
}

// quietComponents are components whose level is at least this one unless --log-level names
// them: grpc-go logs every connection's life at Info.
var quietComponents = map[string]slog.Level{"grpc": slog.LevelWarn}

// levelNone turns a component's logs off.
const levelNone = slog.Level(math.MaxInt32)

// ErrLogLevel is a --log-level value that does not parse.
var ErrLogLevel = errors.New("invalid log level")

// Levels is the --log-level setting: a level for every logger, and levels for some components
// (the "component" attribute of a logger, the innermost one when loggers nest: xds-server's "ads"
// follows "ads" if named, else "xds-server", else the default). It may change while the process
// runs (Set, ServeHTTP), as istiod's --log_output_level and ControlZ do.
type Levels struct{ spec atomic.Pointer[levelSpec] }

type levelSpec struct {
	text       string
	def        slog.Level
	components map[string]slog.Level
}

// ParseLevels parses a --log-level value: a level ("info"), or comma-separated parts, each a
// level for every component not named ("default:info", or a bare level) or a component's
// ("xds-server:debug"). Levels are debug, info, warn, error and none.
func ParseLevels(s string) (*Levels, error) {
	var l Levels
	if err := l.Set(s); err != nil {
		return nil, err
	}
	return &l, nil
}

// Set replaces the levels with those s gives (ParseLevels); on an error, nothing changes.
func (l *Levels) Set(s string) error {
	spec, err := parseLevels(s)
	if err != nil {
		return err
	}
	l.spec.Store(spec)
	return nil
}

// String is the setting as given.
func (l *Levels) String() string { return l.spec.Load().text }

func parseLevels(s string) (*levelSpec, error) {
	spec := &levelSpec{text: s, def: slog.LevelInfo, components: map[string]slog.Level{}}
	seen := map[string]bool{}
	for i, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		name, level, named := strings.Cut(part, ":")
		if !named {
			name, level = "default", part
		}
		fail := func(format string, args ...any) error {
			return fmt.Errorf("%w %q: part %d %q: %s", ErrLogLevel, s, i+1, part, fmt.Sprintf(format, args...))
		}
		if name != "default" && !slices.Contains(Components, name) {
			return nil, fail("unknown component %q (components: default, %s)", name, strings.Join(Components, ", "))
		}
		if seen[name] {
			return nil, fail("%s is given twice", name)
		}
		seen[name] = true
		lv, err := parseLevel(level)
		if err != nil {
			return nil, fail("%v", err)
		}
		if name == "default" {
			spec.def = lv
		} else {
			spec.components[name] = lv
		}
	}
	for name, least := range quietComponents {
		if !seen[name] {
			spec.components[name] = max(spec.def, least)
		}
	}
	return spec, nil
}

func parseLevel(s string) (slog.Level, error) {
	if strings.EqualFold(s, "none") {
		return levelNone, nil
	}
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(s)); err != nil {
		return 0, fmt.Errorf("level %q is none of debug, info, warn, error, none", s)
	}
	return lv, nil
}

// level is the level of a logger with these components (outermost first).
func (l *Levels) level(components []string) slog.Level {
	spec := l.spec.Load()
	for _, c := range slices.Backward(components) {
		if lv, ok := spec.components[c]; ok {
			return lv
		}
	}
	return spec.def
}

// Handler filters what h receives by these levels; h itself must let every level through.
func (l *Levels) Handler(h slog.Handler) slog.Handler {
	return &levelHandler{inner: h, levels: l}
}

// ServeHTTP shows the levels (GET) or sets them (PUT, the new --log-level value as the body),
// so an operator turns one component's debug logs on without a restart. Serve it to operators
// only (monitoring.Server.HandleDebug: loopback callers), since debug logs of every component
// can flood the logs.
func (l *Levels) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.Method {
	case http.MethodGet:
	case http.MethodPut:
		body, err := io.ReadAll(io.LimitReader(r.Body, 4096))
		if err == nil {
			err = l.Set(strings.TrimSpace(string(body)))
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
	default:
		w.Header().Set("Allow", "GET, PUT")
		http.Error(w, "GET shows the log levels, PUT sets them", http.StatusMethodNotAllowed)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	fmt.Fprintln(w, l.String())
}

// levelHandler is a slog.Handler enabled at the level of its logger's components.
type levelHandler struct {
	inner      slog.Handler
	levels     *Levels
	components []string
	// grouped: attributes go into a group from now on, so a "component" among them is not the
	// logger's.
	grouped bool
}

func (h *levelHandler) Enabled(_ context.Context, level slog.Level) bool {
	return level >= h.levels.level(h.components)
}

func (h *levelHandler) Handle(ctx context.Context, r slog.Record) error {
	return h.inner.Handle(ctx, r)
}

func (h *levelHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	next := *h
	next.inner = h.inner.WithAttrs(attrs)
	if !h.grouped {
		for _, a := range attrs {
			if a.Key == "component" {
				next.components = append(slices.Clip(next.components), a.Value.String())
			}
		}
	}
	return &next
}

func (h *levelHandler) WithGroup(name string) slog.Handler {
	next := *h
	next.inner = h.inner.WithGroup(name)
	next.grouped = true
	return &next
}
