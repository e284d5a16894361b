package cli

import (
	"bytes"
	"errors"
	"io/fs"
	"log/slog"
	"maps"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestParseLevels(t *testing.T) {
	for _, tc := range []struct {
		in         string
		def        slog.Level
		components map[string]slog.Level
		// wantErr: parts the error must name.
		wantErr []string
	}{
		{in: "info", def: slog.LevelInfo, components: map[string]slog.Level{"grpc": slog.LevelWarn}},
		{in: "debug", def: slog.LevelDebug, components: map[string]slog.Level{"grpc": slog.LevelWarn}},
		// A default above grpc's own keeps grpc quieter still.
		{in: "error", def: slog.LevelError, components: map[string]slog.Level{"grpc": slog.LevelError}},
		{in: "default:info,xds-server:debug,bus:warn", def: slog.LevelInfo,
			components: map[string]slog.Level{"xds-server": slog.LevelDebug, "bus": slog.LevelWarn, "grpc": slog.LevelWarn}},
		{in: "ads:debug, WARN", def: slog.LevelWarn, components: map[string]slog.Level{"ads": slog.LevelDebug, "grpc": slog.LevelWarn}},
		{in: "grpc:info,klog:none", def: slog.LevelInfo, components: map[string]slog.Level{"grpc": slog.LevelInfo, "klog": levelNone}},

		{in: "verbose", wantErr: []string{`part 1 "verbose"`, `level "verbose"`}},
		{in: "default:info,xds:debug", wantErr: []string{`part 2 "xds:debug"`, `unknown component "xds"`, "xds-server"}},
		{in: "info,ca:loud", wantErr: []string{`part 2 "ca:loud"`, `level "loud"`}},
		{in: "ca:debug,ca:info", wantErr: []string{`part 2 "ca:info"`, "ca is given twice"}},
		{in: "info,debug", wantErr: []string{`part 2 "debug"`, "default is given twice"}},
		{in: "info,", wantErr: []string{`part 2 ""`}},
		{in: "", wantErr: []string{`part 1 ""`}},
	} {
		t.Run(tc.in, func(t *testing.T) {
			l, err := ParseLevels(tc.in)
			if tc.wantErr != nil {
				if !errors.Is(err, ErrLogLevel) {
					t.Fatalf("ParseLevels(%q) = %v, want ErrLogLevel", tc.in, err)
				}
				for _, want := range tc.wantErr {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("error %q does not say %q", err, want)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			spec := l.spec.Load()
			if spec.def != tc.def || !maps.Equal(spec.components, tc.components) {
				t.Errorf("default %v, components %v; want %v, %v", spec.def, spec.components, tc.def, tc.components)
			}
			if l.String() != tc.in {
				t.Errorf("String() = %q, want %q", l.String(), tc.in)
			}
		})
	}
}

// lines keeps what a text handler wrote, one string per line.
type lines struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *lines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *lines) take() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.buf.String()
	l.buf.Reset()
	return s
}

// TestComponentLevels: a component's debug lines appear while the others stay at the default
// level; a nested component follows its own level if named, else its parent's; grpc stays at
// warn unless named; and a change at runtime (Set, or PUT on ServeHTTP) applies to existing
// loggers.
func TestComponentLevels(t *testing.T) {
	levels, err := ParseLevels("default:info,xds-server:debug")
	if err != nil {
		t.Fatal(err)
	}
	out := &lines{}
	root := slog.New(levels.Handler(slog.NewTextHandler(out, &slog.HandlerOptions{Level: slog.Level(math.MinInt32)})))
	xds := root.With("component", "xds-server")
	ads := xds.With("component", "ads")
	bus := root.With("component", "bus")
	grpcLog := grpcLogger{root.With("component", "grpc")}
	// A "component" inside a group is some other thing's, not the logger's.
	grouped := root.WithGroup("peer").With("component", "xds-server")

	logAll := func() {
		root.Debug("root debug")
		root.Info("root info")
		xds.Debug("xds-server debug")
		ads.Debug("ads debug")
		bus.Debug("bus debug")
		bus.Info("bus info")
		grouped.Debug("grouped debug")
		grpcLog.Info("grpc info")
		grpcLog.Warning("grpc warning")
		if grpcLog.V(2) {
			grpcLog.Info("grpc verbose")
		}
	}
	check := func(t *testing.T, want ...string) {
		t.Helper()
		logAll()
		var got []string
		for l := range strings.Lines(out.take()) {
			_, msg, _ := strings.Cut(l, `msg="`)
			msg, _, _ = strings.Cut(msg, `"`)
			got = append(got, msg)
		}
		if !slices.Equal(got, want) {
			t.Errorf("logged %q, want %q", got, want)
		}
	}

	t.Run("flag", func(t *testing.T) {
		check(t, "root info", "xds-server debug", "ads debug", "bus info", "grpc warning")
	})
	t.Run("Set", func(t *testing.T) {
		if err := levels.Set("debug,ads:info,bus:warn,grpc:debug"); err != nil {
			t.Fatal(err)
		}
		check(t, "root debug", "root info", "xds-server debug", "grouped debug", "grpc info", "grpc warning", "grpc verbose")
		if err := levels.Set("debug,nope:info"); err == nil {
			t.Error("Set accepted an unknown component")
		}
		if levels.String() != "debug,ads:info,bus:warn,grpc:debug" {
			t.Errorf("a refused Set changed the levels to %q", levels.String())
		}
	})
	t.Run("ServeHTTP", func(t *testing.T) {
		put := func(body string) *httptest.ResponseRecorder {
			w := httptest.NewRecorder()
			levels.ServeHTTP(w, httptest.NewRequest(http.MethodPut, "/debug/loglevel", strings.NewReader(body)))
			return w
		}
		if w := put("info,bus:debug\n"); w.Code != http.StatusOK || w.Body.String() != "info,bus:debug\n" {
			t.Errorf("PUT: %d %q", w.Code, w.Body)
		}
		check(t, "root info", "bus debug", "bus info", "grpc warning")
		if w := put("info,bus:loud"); w.Code != http.StatusBadRequest || !strings.Contains(w.Body.String(), `level "loud"`) {
			t.Errorf("PUT of a bad value: %d %q", w.Code, w.Body)
		}
		w := httptest.NewRecorder()
		levels.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/debug/loglevel", nil))
		if w.Body.String() != "info,bus:debug\n" {
			t.Errorf("GET: %q", w.Body)
		}
	})
}

// TestComponentsListed: Components lists exactly the components Sailplane's loggers carry (every
// `"component", "…"` literal and RouteLibraryLogs name in the repository's Go code), so that
// --log-level accepts them all and rejects what none carries.
func TestComponentsListed(t *testing.T) {
	literal := regexp.MustCompile(`(?:"component",\s*|RouteLibraryLogs\()"([^"]+)"`)
	found := map[string]string{}
	root := filepath.Join("..", "..")
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".")) && path != root {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range literal.FindAllSubmatch(src, -1) {
			found[string(m[1])] = path
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for name, path := range found {
		if !slices.Contains(Components, name) {
			t.Errorf("component %q (%s) is not in cli.Components: add it there, so that --log-level accepts it", name, path)
		}
	}
	for _, name := range Components {
		if _, ok := found[name]; !ok {
			t.Errorf("cli.Components lists %q, which no logger carries", name)
		}
	}
}
