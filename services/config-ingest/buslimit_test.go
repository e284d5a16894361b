package configingest_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	networking "istio.io/api/networking/v1alpha3"

	configingest "sailplane.dev/services/config-ingest"
	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/config"
	"sailplane.dev/shared/schema"
	"sailplane.dev/shared/testlog"
)

// A resource the bus refuses (over its size limit) is reported with its file and keeps its
// previous version on the bus, while the rest of the same edit is published; once it fits
// again it is published and the problem clears.
func TestOversizedResourceKeepsPreviousVersion(t *testing.T) {
	const limit = 4 << 10
	store := bus.NewStore(bus.WithLogger(testlog.New(t, slog.LevelDebug)), bus.WithMaxResourceBytes(limit))
	root := t.TempDir()
	dir := filepath.Join(root, "conf")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(dir, "big.yaml"), vsDoc("big", "v1", 100))
	write(t, filepath.Join(dir, "other.yaml"), vsDoc("other", "v1", 100))

	svc, err := configingest.New(configingest.Config{ConfigDirs: []string{dir}, Debounce: 20 * time.Millisecond},
		configingest.Deps{Logger: testlog.New(t, slog.LevelDebug), Publisher: store})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	<-svc.Ready()

	host := func(name string) string {
		r, ok := store.Get(schema.VirtualService.TypeURL, name)
		if !ok {
			return ""
		}
		return r.Body.(*networking.VirtualService).Hosts[0]
	}
	tooLarge := func() (*config.Error, *bus.TooLargeError) {
		for _, p := range svc.Problems() {
			var ce *config.Error
			var tl *bus.TooLargeError
			if errors.As(p, &ce) && errors.As(p, &tl) {
				return ce, tl
			}
		}
		return nil, nil
	}
	if host("default/big") != "v1" || host("default/other") != "v1" {
		t.Fatalf("initial state: big=%q other=%q", host("default/big"), host("default/other"))
	}

	// One edit: big grows over the limit (an annotation of 8 KiB), other changes normally.
	huge := strings.Replace(vsDoc("big", "v2", 100), "  name: big\n",
		"  name: big\n  annotations:\n    note: "+strings.Repeat("x", 2*limit)+"\n", 1)
	write(t, filepath.Join(dir, "big.yaml"), huge)
	write(t, filepath.Join(dir, "other.yaml"), vsDoc("other", "v2", 100))
	eventually(t, "the oversized resource reported", func() bool { ce, _ := tooLarge(); return ce != nil })
	ce, tl := tooLarge()
	if ce.File != filepath.Join(dir, "big.yaml") || ce.Kind != "VirtualService" || ce.Namespace != "default" || ce.Name != "big" {
		t.Errorf("problem names %q %s %s/%s, want big.yaml's VirtualService default/big", ce.File, ce.Kind, ce.Namespace, ce.Name)
	}
	if tl.Limit != limit || tl.Size <= limit {
		t.Errorf("size %d, limit %d", tl.Size, tl.Limit)
	}
	eventually(t, "other published", func() bool { return host("default/other") == "v2" })
	if got := host("default/big"); got != "v1" {
		t.Errorf("big on the bus = %q, want its previous version (v1)", got)
	}

	// Back under the limit: published, problem gone.
	write(t, filepath.Join(dir, "big.yaml"), vsDoc("big", "v3", 100))
	eventually(t, "big v3 published and the problem cleared", func() bool {
		ce, _ := tooLarge()
		return host("default/big") == "v3" && ce == nil
	})
}
