package configingest_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	meshv1alpha1 "istio.io/api/mesh/v1alpha1"
	networking "istio.io/api/networking/v1alpha3"

	configingest "sailplane.dev/services/config-ingest"
	"sailplane.dev/shared/schema"
	"sailplane.dev/shared/testlog"
)

// run starts a Service with cfg until the returned stop is called (or the test ends).
func run(t *testing.T, cfg configingest.Config, rec *recorder) (svc *configingest.Service, stop func()) {
	t.Helper()
	if cfg.Debounce == 0 {
		cfg.Debounce = 20 * time.Millisecond
	}
	svc, err := configingest.New(cfg, configingest.Deps{Logger: testlog.New(t, slog.LevelDebug), Publisher: rec})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}
	t.Cleanup(stop)
	select {
	case <-svc.Ready():
	case err := <-done:
		t.Fatalf("Run returned before ready: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("not ready")
	}
	return svc, stop
}

func weights(rec *recorder, name string) []int32 {
	r := rec.get(schema.VirtualService, name)
	if r == nil {
		return nil
	}
	var out []int32
	for _, d := range r.Body.(*networking.VirtualService).Http[0].Route {
		out = append(out, d.Weight)
	}
	return out
}

func split(name string, w1, w2 int) string {
	return `apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: ` + name + `}
spec:
  hosts: [echo]
  http:
  - route:
    - {destination: {host: echo, subset: v1}, weight: ` + itoa(w1) + `}
    - {destination: {host: echo, subset: v2}, weight: ` + itoa(w2) + `}
`
}

func hasProblem(svc *configingest.Service, target error, parts ...string) bool {
	return findProblem(svc, target, parts...) != nil
}

func (r *recorder) deleted(k schema.Kind) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.deletes[k.TypeURL]
}

// A restart serves what was served before: a VirtualService whose file became invalid while
// config-ingest was stopped keeps its last valid version, from the state directory.
func TestRestartKeepsLastValid(t *testing.T) {
	root := t.TempDir()
	mesh, state := filepath.Join(root, "mesh.yaml"), filepath.Join(root, "state")
	write(t, mesh, "")
	write(t, filepath.Join(root, "conf", "split.yaml"), split("split", 80, 20))
	cfg := configingest.Config{MeshFile: mesh, StateDir: state}

	rec := newRecorder()
	_, stop := run(t, cfg, rec)
	if got := weights(rec, "default/split"); len(got) != 2 || got[0] != 80 {
		t.Fatalf("first run: weights %v", got)
	}
	// Invalid while running: the last valid version stays (and is what gets saved).
	write(t, filepath.Join(root, "conf", "split.yaml"), split("split", -180, 20))
	stop()
	if _, err := os.Stat(filepath.Join(state, configingest.StateFile)); err != nil {
		t.Fatalf("no state saved: %v", err)
	}

	rec = newRecorder()
	svc, _ := run(t, cfg, rec)
	if got := weights(rec, "default/split"); len(got) != 2 || got[0] != 80 || got[1] != 20 {
		t.Fatalf("after restart, weights %v, want the last valid 80/20", got)
	}
	if !hasProblem(svc, nil, "split.yaml", "weight") {
		t.Fatalf("problems = %v, want the invalid file named", svc.Problems())
	}
	// Fixing the file takes effect as usual.
	write(t, filepath.Join(root, "conf", "split.yaml"), split("split", 50, 50))
	eventually(t, "fixed", func() bool { w := weights(rec, "default/split"); return len(w) == 2 && w[0] == 50 })
}

// The state saved for restarts follows changes made while running, even when config-ingest
// stops right after one (the state is saved after publishing, and again on stop).
func TestRestartKeepsChangeMadeBeforeStop(t *testing.T) {
	root := t.TempDir()
	mesh, state := filepath.Join(root, "mesh.yaml"), filepath.Join(root, "state")
	write(t, mesh, "")
	write(t, filepath.Join(root, "conf", "split.yaml"), split("split", 80, 20))
	cfg := configingest.Config{MeshFile: mesh, StateDir: state}

	rec := newRecorder()
	_, stop := run(t, cfg, rec)
	write(t, filepath.Join(root, "conf", "split.yaml"), split("split", 50, 50))
	eventually(t, "change published", func() bool { w := weights(rec, "default/split"); return len(w) == 2 && w[0] == 50 })
	stop()

	write(t, filepath.Join(root, "conf", "split.yaml"), split("split", -180, 20))
	rec = newRecorder()
	run(t, cfg, rec)
	if got := weights(rec, "default/split"); len(got) != 2 || got[0] != 50 || got[1] != 50 {
		t.Fatalf("after restart, weights %v, want the last valid 50/50", got)
	}
}

// Without configSources, the conf folder beside the mesh file is read; an empty mesh file is
// Istio's defaults.
func TestDefaultConfigFolder(t *testing.T) {
	root := t.TempDir()
	write(t, filepath.Join(root, "mesh.yaml"), "")
	write(t, filepath.Join(root, "conf", "split.yaml"), split("split", 80, 20))
	rec := newRecorder()
	svc, _ := run(t, configingest.Config{MeshFile: filepath.Join(root, "mesh.yaml")}, rec)
	if rec.get(schema.VirtualService, "default/split") == nil || rec.get(schema.MeshConfig, "mesh") == nil {
		t.Fatalf("state = %v, problems = %v", rec.state, svc.Problems())
	}
	if p := svc.Problems(); len(p) != 0 {
		t.Fatalf("problems = %v", p)
	}
}

// mesh.yaml switched to a folder that does not exist keeps what was served, says so, and
// switches by itself when the folder appears.
func TestMissingConfigSource(t *testing.T) {
	root := t.TempDir()
	mesh := filepath.Join(root, "mesh.yaml")
	write(t, mesh, "configSources: [{address: fs://conf}]\n")
	write(t, filepath.Join(root, "conf", "split.yaml"), split("split", 80, 20))
	rec := newRecorder()
	svc, _ := run(t, configingest.Config{MeshFile: mesh}, rec)

	write(t, mesh, "configSources: [{address: fs://later/conf}]\n")
	eventually(t, "missing folder reported", func() bool { return hasProblem(svc, configingest.ErrUnreadable, "later/conf") })
	if rec.get(schema.VirtualService, "default/split") == nil || rec.deleted(schema.VirtualService) != 0 {
		t.Fatal("resources deleted while the configured folder does not exist")
	}
	write(t, filepath.Join(root, "later", "conf", "other.yaml"), split("other", 50, 50))
	eventually(t, "switched", func() bool {
		return rec.get(schema.VirtualService, "default/other") != nil && rec.get(schema.VirtualService, "default/split") == nil
	})
}

// A file written in place by a writer that pauses halfway: the half that is valid YAML is not
// taken for the whole file, nothing it held is deleted.
func TestFileBeingWritten(t *testing.T) {
	root := t.TempDir()
	p := filepath.Join(root, "conf", "vs.yaml")
	write(t, filepath.Join(root, "mesh.yaml"), "")
	full := split("one", 80, 20) + "---\n" + split("two", 80, 20)
	write(t, p, full)
	rec := newRecorder()
	svc, _ := run(t, configingest.Config{MeshFile: filepath.Join(root, "mesh.yaml"), Settle: time.Minute}, rec)

	f, err := os.OpenFile(p, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(split("one", 80, 20) + "---\n"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "half-written file noticed", func() bool { return hasProblem(svc, configingest.ErrSettling, "vs.yaml") })
	if rec.get(schema.VirtualService, "default/two") == nil {
		t.Fatal("half-written file deleted a resource")
	}
	if _, err := f.WriteString(split("two", 70, 30)); err != nil {
		t.Fatal(err)
	}
	eventually(t, "write completed", func() bool { w := weights(rec, "default/two"); return len(w) == 2 && w[0] == 70 })
	if n := rec.deleted(schema.VirtualService); n != 0 {
		t.Fatalf("%d deletions published while the file was written", n)
	}
	eventually(t, "problem cleared", func() bool { return len(svc.Problems()) == 0 })
}

// A symlinked file whose target lives outside the config folder: editing the target is seen.
func TestSymlinkTargetOutside(t *testing.T) {
	root, outside := t.TempDir(), t.TempDir()
	write(t, filepath.Join(root, "mesh.yaml"), "")
	write(t, filepath.Join(outside, "split.yaml"), split("split", 80, 20))
	if err := os.MkdirAll(filepath.Join(root, "conf"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(outside, "split.yaml"), filepath.Join(root, "conf", "split.yaml")); err != nil {
		t.Fatal(err)
	}
	rec := newRecorder()
	run(t, configingest.Config{MeshFile: filepath.Join(root, "mesh.yaml")}, rec)
	if w := weights(rec, "default/split"); len(w) != 2 || w[0] != 80 {
		t.Fatalf("weights %v", w)
	}
	write(t, filepath.Join(outside, "split.yaml"), split("split", 10, 90))
	eventually(t, "target edit seen", func() bool { w := weights(rec, "default/split"); return len(w) == 2 && w[0] == 10 })
}

// A mesh file broken while config-ingest was stopped: the restart uses the mesh config saved
// by the previous run (and so reads the same folders), reports the file, and reloads it once
// fixed.
func TestRestartWithBrokenMeshFile(t *testing.T) {
	root := t.TempDir()
	mesh, state := filepath.Join(root, "mesh.yaml"), filepath.Join(root, "state")
	write(t, mesh, "rootNamespace: sailplane\nconfigSources: [{address: fs://custom}]\n")
	write(t, filepath.Join(root, "custom", "split.yaml"), split("split", 80, 20))
	cfg := configingest.Config{MeshFile: mesh, StateDir: state}
	_, stop := run(t, cfg, newRecorder())
	stop()

	write(t, mesh, "rootNamespace: [broken\n")
	rec := newRecorder()
	svc, _ := run(t, cfg, rec)
	rootNS := func() string {
		r := rec.get(schema.MeshConfig, "mesh")
		if r == nil {
			return ""
		}
		return r.Body.(*meshv1alpha1.MeshConfig).RootNamespace
	}
	if rootNS() != "sailplane" || rec.get(schema.VirtualService, "default/split") == nil {
		t.Fatalf("after restart: root namespace %q, state %v", rootNS(), rec.state)
	}
	if !hasProblem(svc, nil, "mesh.yaml", "malformed") {
		t.Fatalf("problems = %v, want the mesh file named", svc.Problems())
	}
	write(t, mesh, "rootNamespace: fixed\nconfigSources: [{address: fs://custom}]\n")
	eventually(t, "mesh file fixed", func() bool { return rootNS() == "fixed" && len(svc.Problems()) == 0 })
}

// Two configurations run one after the other with the same state folder (two mesh files in one
// folder, as hyper --mesh-config does): the second, whose only config source cannot be read,
// serves nothing of the first's config and does not take the first's mesh config as its own.
func TestStateBelongsToItsConfiguration(t *testing.T) {
	root := t.TempDir()
	first, second, state := filepath.Join(root, "mesh.yaml"), filepath.Join(root, "other.yaml"), filepath.Join(root, "state")
	write(t, first, "rootNamespace: first\n")
	write(t, filepath.Join(root, "conf", "split.yaml"), split("split", 80, 20))
	_, stop := run(t, configingest.Config{MeshFile: first, StateDir: state}, newRecorder())
	stop()

	write(t, second, "configSources: [{address: xds://127.0.0.1:15010}]\n")
	rec := newRecorder()
	svc, _ := run(t, configingest.Config{MeshFile: second, StateDir: state}, rec)
	if got := rec.count(schema.VirtualService); got != 0 {
		t.Fatalf("the second configuration serves %d VirtualServices of the first", got)
	}
	if !hasProblem(svc, nil, "xds://127.0.0.1:15010") {
		t.Fatalf("problems = %v, want the unreadable source named", svc.Problems())
	}

	// A mesh file that cannot be loaded does not start from another mesh file's saved config.
	if err := os.Remove(first); err != nil {
		t.Fatal(err)
	}
	svc, err := configingest.New(configingest.Config{MeshFile: first, StateDir: state}, configingest.Deps{Logger: testlog.New(t, slog.LevelDebug), Publisher: newRecorder()})
	if err != nil {
		t.Fatal(err)
	}
	if err := svc.CheckMesh(); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("CheckMesh with the mesh file gone and only another's saved = %v, want not found", err)
	}
}

// The first run of a folder without its mesh file fails before writing anything, with an error
// naming the file looked for and the way out; a mesh config saved for that very file stands in.
func TestCheckMesh(t *testing.T) {
	root := t.TempDir()
	mesh, state := filepath.Join(root, "etc/sailplane/mesh.yaml"), filepath.Join(root, "var/lib/sailplane")
	cfg := configingest.Config{MeshFile: mesh, StateDir: state}
	svc, err := configingest.New(cfg, configingest.Deps{Logger: testlog.New(t, slog.LevelDebug), Publisher: newRecorder()})
	if err != nil {
		t.Fatal(err)
	}
	err = svc.CheckMesh()
	var mfe *configingest.MeshFileError
	if !errors.As(err, &mfe) || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("CheckMesh = %v, want a *MeshFileError, not found", err)
	}
	for _, want := range []string{mesh, "--mesh-config", "--config-source"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	// Run says the same.
	if err := svc.Run(context.Background()); !errors.As(err, &mfe) || !strings.Contains(err.Error(), mesh) {
		t.Errorf("Run = %v, want the mesh file named", err)
	}
	if entries, _ := os.ReadDir(root); len(entries) != 0 {
		t.Fatalf("files written without a mesh file: %v", entries)
	}

	write(t, mesh, "rootNamespace: saved\n")
	_, stop := run(t, cfg, newRecorder())
	stop()
	if err := os.Remove(mesh); err != nil {
		t.Fatal(err)
	}
	if err := svc.CheckMesh(); err != nil {
		t.Fatalf("CheckMesh with a mesh config saved for this file = %v", err)
	}
}

// State files of the previous format say nothing of the configuration they came from: they are
// ignored, with a log line naming the file.
func TestOldStateFilesIgnored(t *testing.T) {
	root := t.TempDir()
	mesh, state := filepath.Join(root, "mesh.yaml"), filepath.Join(root, "state")
	write(t, filepath.Join(state, configingest.MeshStateFile), `{"rootNamespace":"old"}`)
	write(t, filepath.Join(state, configingest.StateFile),
		`{"version":1,"roots":["`+filepath.Join(root, "conf")+`"],"files":{"`+filepath.Join(root, "conf", "split.yaml")+`":[`+
			`{"type":"networking.istio.io/v1/VirtualService","namespace":"default","name":"split","spec":{"hosts":["echo"]}}]}}`)
	logs := &logBuffer{}
	svc, err := configingest.New(configingest.Config{MeshFile: mesh, StateDir: state}, configingest.Deps{Logger: slog.New(slog.NewTextHandler(logs, nil)), Publisher: newRecorder()})
	if err != nil {
		t.Fatal(err)
	}
	if err := svc.CheckMesh(); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("CheckMesh with an old saved mesh config = %v, want not found", err)
	}
	if !strings.Contains(logs.String(), "saved mesh config ignored") || !strings.Contains(logs.String(), filepath.Join(state, configingest.MeshStateFile)) {
		t.Errorf("log does not name the old mesh state file:\n%s", logs)
	}

	write(t, mesh, "")
	write(t, filepath.Join(root, "conf", "split.yaml"), "kind: VirtualService\nspec: [unclosed\n")
	logs = &logBuffer{}
	rec := newRecorder()
	svc, err = configingest.New(configingest.Config{MeshFile: mesh, StateDir: state, Debounce: 20 * time.Millisecond}, configingest.Deps{Logger: slog.New(slog.NewTextHandler(logs, nil)), Publisher: rec})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	select {
	case <-svc.Ready():
	case err := <-done:
		t.Fatalf("Run: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("not ready")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := rec.count(schema.VirtualService); got != 0 {
		t.Errorf("%d VirtualServices restored from a state of the old format", got)
	}
	if !strings.Contains(logs.String(), "saved config state ignored") || !strings.Contains(logs.String(), filepath.Join(state, configingest.StateFile)) ||
		!strings.Contains(logs.String(), "format 1") {
		t.Errorf("log does not name the old state file:\n%s", logs)
	}
}

// logBuffer is a log destination safe for the service's goroutines.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
