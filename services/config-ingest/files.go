package configingest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	meshv1alpha1 "istio.io/api/mesh/v1alpha1"

	"sailplane.dev/services/config-ingest/internal/statefile"
	"sailplane.dev/services/config-ingest/internal/tree"
	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/mesh"
	"sailplane.dev/shared/schema"
)

// DefaultStateDir is the mains' --state-dir under the mesh file's root (mesh.Root): beside its
// etc/sailplane, so /var/lib/sailplane for /etc/sailplane/mesh.yaml. See StateDirFor.
const DefaultStateDir = "var/lib/sailplane"

// StateDirFor is the default state folder of a mesh file: DefaultStateDir under mesh.Root, so
// that each configuration keeps its own state whatever the working folder (and, with no mesh
// file, under the working folder).
func StateDirFor(meshFile string) string {
	return filepath.Join(mesh.Root(meshFile), DefaultStateDir)
}

// MeshStateFile is the file, under Config.StateDir, holding the last good mesh config and the
// mesh file it came from: used at start when that mesh file cannot be loaded.
const MeshStateFile = "config-ingest-mesh.json"

// StateFile is the file, under Config.StateDir, holding the last valid version of every config
// file's resources, by config source.
const StateFile = "config-ingest-files.json"

// meshStateVersion is the format of MeshStateFile; the first format was the bare mesh config,
// without the mesh file it came from.
const meshStateVersion = 2

type savedMesh struct {
	Version  int             `json:"version"`
	MeshFile string          `json:"meshFile"` // absolute
	Mesh     json.RawMessage `json:"mesh"`
}

// maxDelay bounds how long a continuous stream of events can postpone a rescan.
const maxDelay = time.Second

// saveDelay is how long the saved state may trail the published config: a crash in between
// restarts from the state before the last changes, as a crash just before them would.
const saveDelay = time.Second

// runNetworksFile publishes the meshNetworks file beside the mesh file (mesh.NetworksFile) now
// and on every change, until ctx is done.
func (s *Service) runNetworksFile(ctx context.Context, wg *sync.WaitGroup) {
	path := mesh.NetworksFile(s.cfg.MeshFile)
	publish := func(nets *meshv1alpha1.MeshNetworks) {
		var rs []*bus.Resource
		if nets != nil {
			rs = []*bus.Resource{{Name: "mesh-networks", Body: nets}}
		}
		s.published(nil, schema.MeshNetworks.TypeURL, rs, s.pub.Replace(schema.MeshNetworks.TypeURL, rs))
	}
	setErr := func(err error) {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.netsProblem = err
	}
	// Loaded now, so that the first published state has them; the watch publishes changes.
	nets, err := mesh.LoadNetworks(path)
	setErr(err)
	publish(nets)
	wg.Go(func() {
		first := true
		err := mesh.WatchNetworks(ctx, path, s.cfg.Debounce, s.log, func(m *meshv1alpha1.MeshNetworks) {
			if first && proto.Equal(m, nets) {
				first = false
				return
			}
			first = false
			publish(m)
		}, setErr)
		if err != nil {
			s.log.Error("meshNetworks not watched", "file", path, "error", err)
		}
	})
}

// runFiles is Run in files mode.
func (s *Service) runFiles(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	// The mesh file: watched by mesh.Watcher, which hands us each new config.
	meshCh := make(chan *meshv1alpha1.MeshConfig, 1)
	watchErr := make(chan error, 1)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	var current *meshv1alpha1.MeshConfig
	if s.cfg.MeshFile != "" {
		opts := []mesh.WatcherOption{mesh.WithLogger(s.log), mesh.WithDebounce(s.cfg.Debounce), mesh.WithReloadErrors(func(err error) {
			s.mu.Lock()
			defer s.mu.Unlock()
			s.meshProblems = nil
			if err != nil {
				s.meshProblems = []error{err}
			}
		})}
		if saved := s.savedMesh(); saved != nil {
			opts = append(opts, mesh.WithFallback(saved))
		}
		w := mesh.NewWatcher(s.cfg.MeshFile, func(m *meshv1alpha1.MeshConfig) {
			// Only the latest config matters: replace one not yet taken.
			select {
			case <-meshCh:
			default:
			}
			meshCh <- m
		}, opts...)
		wg.Add(1)
		go func() {
			defer wg.Done()
			watchErr <- w.Run(ctx)
		}()
		select {
		case current = <-meshCh:
		case err := <-watchErr:
			return &MeshFileError{Path: s.cfg.MeshFile, Err: err}
		case <-ctx.Done():
			return nil
		}
	} else {
		current = mesh.Default()
	}
	if s.cfg.MeshFile != "" {
		s.runNetworksFile(ctx, &wg)
	}
	meshState := []*bus.Resource{meshResource(current)}
	s.published(nil, schema.MeshConfig.TypeURL, meshState, s.pub.Replace(schema.MeshConfig.TypeURL, meshState))
	s.saveMesh(current)

	fw, err := fsnotify.NewWatcher()
	if err != nil {
		return err
	}
	defer fw.Close()
	f := &folders{s: s, fw: fw, watched: map[string]bool{},
		tree: tree.New(s.cfg.DefaultNamespace, s.log, tree.WithSettle(s.cfg.Settle))}
	if s.cfg.StateDir != "" {
		f.writer = statefile.NewWriter(s.log, f.statePath())
		defer f.writer.Close()
	}
	f.setSources(current)
	f.restore()
	f.scan()
	for _, k := range schema.ConfigKinds {
		state := f.tree.State(k.TypeURL)
		s.published(f.tree, k.TypeURL, state, s.pub.Replace(k.TypeURL, state))
	}
	f.save()
	s.noteGatewayInputs(f.tree.Published(), nil)
	close(s.ready)
	s.log.Info("config published", "folders", f.roots, "resources", len(f.tree.Published()), "problems", len(f.tree.Problems()))

	debounce := time.NewTimer(time.Hour)
	debounce.Stop()
	defer debounce.Stop()
	settle := time.NewTimer(time.Hour)
	settle.Stop()
	defer settle.Stop()
	// The state is saved saveDelay after a rescan, and when config-ingest stops: encoding the
	// whole tree costs tens of milliseconds of CPU at a thousand services, which should
	// neither delay the change nor compete with the pushes it causes.
	save := time.NewTimer(time.Hour)
	save.Stop()
	defer save.Stop()
	defer f.save()
	var first time.Time // of the pending burst; zero when none is pending
	rescan := func() {
		ctx, span := startRescan(first)
		first = time.Time{}
		changes := f.scanTraced(ctx)
		f.publish(ctx, changes)
		s.noteGatewayInputs(f.tree.Published(), changes)
		span.End()
		save.Reset(saveDelay)
		if f.newDirs {
			// Files created in new folders before they were watched brought no event.
			debounce.Reset(s.cfg.Debounce)
		}
		if at := f.tree.SettleAt(); !at.IsZero() {
			settle.Reset(time.Until(at))
		}
	}
	if f.newDirs || !f.tree.SettleAt().IsZero() {
		rescan()
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-watchErr:
			return err
		case m := <-meshCh:
			current = m
			mr := meshResource(m)
			s.published(nil, schema.MeshConfig.TypeURL, []*bus.Resource{mr}, s.pub.Upsert(schema.MeshConfig.TypeURL, mr))
			s.saveMesh(m)
			if f.setSources(m) {
				s.log.Info("config folders changed", "folders", f.roots)
				rescan()
			}
		case ev, ok := <-fw.Events:
			if !ok {
				return nil
			}
			s.log.Debug("config folder event", "event", ev.String())
			// Debounce: wait until the burst (an editor's save, a git checkout) settles, but not
			// longer than maxDelay.
			now := time.Now()
			if first.IsZero() {
				first = now
			}
			if now.Sub(first) < maxDelay {
				debounce.Reset(s.cfg.Debounce)
			}
		case err, ok := <-fw.Errors:
			if !ok {
				return nil
			}
			// Events may have been lost (queue overflow): a rescan catches up.
			s.log.Warn("config folder watch error", "error", err)
			debounce.Reset(s.cfg.Debounce)
		case <-debounce.C:
			rescan()
		case <-settle.C:
			rescan()
		case <-save.C:
			f.save()
		}
	}
}

// MeshFileError: in files mode, the mesh file cannot be loaded at start and no mesh config was
// saved for it by a previous run.
type MeshFileError struct {
	Path string // as configured
	Err  error
}

func (e *MeshFileError) Error() string {
	if errors.Is(e.Err, fs.ErrNotExist) {
		return fmt.Sprintf("no mesh config file %s: name the mesh file with --mesh-config, "+
			"or read config from Kubernetes with --config-source=kubernetes", absPath(e.Path))
	}
	return e.Err.Error() // names the file, and the field
}

func (e *MeshFileError) Unwrap() error { return e.Err }

// CheckMesh reports, reading only, whether Run can start: in files mode, the mesh file must
// load, or a mesh config saved for it by a previous run stand in (*MeshFileError otherwise).
// A main calls it before starting anything, so that a folder without its configuration gets
// no files written (a CA root, a state folder) by a control plane that cannot run.
func (s *Service) CheckMesh() error {
	if s.kube != nil || s.cfg.MeshFile == "" {
		return nil
	}
	_, err := mesh.Load(s.cfg.MeshFile)
	if err == nil || s.savedMesh() != nil {
		return nil
	}
	return fmt.Errorf("config-ingest: %w", &MeshFileError{Path: s.cfg.MeshFile, Err: err})
}

// folders is the state of files mode: the tree of config files, what is watched, and what was
// saved.
type folders struct {
	s       *Service
	tree    *tree.Tree
	fw      *fsnotify.Watcher
	watched map[string]bool

	roots       []string
	unsupported []error // config sources that cannot be read at all
	newDirs     bool    // the last scan found folders not watched before

	saved  []byte            // the state last handed to writer
	writer *statefile.Writer // nil without a state folder
}

// setSources takes the folders to read from m (or Config.ConfigDirs) and reports whether they
// changed.
func (f *folders) setSources(m *meshv1alpha1.MeshConfig) bool {
	roots, err := f.s.sources(m)
	var unsupported []error
	if err != nil {
		unsupported = []error{err}
	}
	changed := !slices.Equal(roots, f.roots) || fmt.Sprint(unsupported) != fmt.Sprint(f.unsupported)
	f.roots, f.unsupported = roots, unsupported
	return changed
}

// scan rescans the folders, updates what is watched and the problems; the caller saves the
// state once the changes are published.
func (f *folders) scan() []tree.Change {
	changes := f.tree.Scan(f.roots, f.unsupported...)
	f.newDirs = f.watch()
	f.s.setProblems(f.tree.Problems())
	return changes
}

// publish publishes changes, each type in a "bus.publish" span of ctx's trace that the
// resources carry on.
func (f *folders) publish(ctx context.Context, changes []tree.Change) {
	for _, c := range changes {
		ctx, span := tracer().Start(ctx, "bus.publish", trace.WithAttributes(attribute.String("sailplane.type", c.TypeURL),
			attribute.Int("sailplane.updated", len(c.Upsert)), attribute.Int("sailplane.deleted", len(c.Delete))))
		if len(c.Upsert) > 0 {
			f.s.published(f.tree, c.TypeURL, c.Upsert, f.s.pub.Upsert(c.TypeURL, bus.Traced(ctx, c.Upsert...)...))
		}
		if len(c.Delete) > 0 {
			f.s.pub.Delete(c.TypeURL, c.Delete...)
			f.s.forget(c.TypeURL, c.Delete)
		}
		f.s.log.Info("config changed", "type", c.TypeURL, "updated", len(c.Upsert), "deleted", len(c.Delete))
		span.End()
	}
}

// watch makes fw watch the folders the tree read and, for a root that cannot be read, its
// nearest existing parent (to notice it appear); it stops watching the others. It reports
// whether it added a folder.
func (f *folders) watch() bool {
	want := map[string]bool{}
	for _, d := range f.tree.Dirs() {
		want[d] = true
	}
	for _, r := range f.roots {
		if real, err := filepath.EvalSymlinks(r); err == nil && want[real] {
			continue
		}
		for d := filepath.Dir(r); ; d = filepath.Dir(d) {
			if st, err := os.Stat(d); err == nil && st.IsDir() {
				want[d] = true
				break
			}
			if d == filepath.Dir(d) {
				break
			}
		}
	}
	added := false
	for d := range want {
		if f.watched[d] {
			continue
		}
		if err := f.fw.Add(d); err != nil {
			f.s.log.Warn("cannot watch config folder", "dir", d, "error", err)
			continue
		}
		f.watched[d] = true
		added = true
	}
	for d := range f.watched {
		if !want[d] {
			_ = f.fw.Remove(d) // fails when the folder is already gone, which is fine
			delete(f.watched, d)
		}
	}
	return added
}

func (f *folders) statePath() string { return filepath.Join(f.s.cfg.StateDir, StateFile) }

// restore loads the saved state of the configured sources, if any, so that the first scan
// keeps the last valid version of what is now invalid or unreadable, as the previous run did.
func (f *folders) restore() {
	if f.s.cfg.StateDir == "" {
		return
	}
	data, err := os.ReadFile(f.statePath())
	if errors.Is(err, fs.ErrNotExist) {
		return
	}
	var ignored []string
	if err == nil {
		ignored, err = f.tree.RestoreState(data, f.roots)
	}
	if err != nil {
		f.s.log.Warn("saved config state ignored: the last valid version of files that are now invalid is lost", "file", f.statePath(), "error", err)
		return
	}
	if len(ignored) > 0 {
		f.s.log.Info("saved config state of sources no longer configured ignored", "file", f.statePath(), "sources", ignored)
	}
	f.saved = data
	f.s.log.Info("saved config state restored", "file", f.statePath())
}

// save hands the tree's state to the writer when it changed.
func (f *folders) save() {
	if f.writer == nil {
		return
	}
	data, err := f.tree.MarshalState()
	if err != nil {
		f.s.log.Warn("cannot save config state: after a restart, files that are invalid then lose their last valid version", "file", f.statePath(), "error", err)
		return
	}
	if bytes.Equal(data, f.saved) {
		return
	}
	f.saved = data
	f.writer.Write(data)
}

// savedMesh returns the mesh config a previous run saved for this mesh file, nil when there is
// none (or no StateDir). One saved for another mesh file is not used: it is another
// configuration's.
func (s *Service) savedMesh() *meshv1alpha1.MeshConfig {
	if s.cfg.StateDir == "" || s.cfg.MeshFile == "" {
		return nil
	}
	path := filepath.Join(s.cfg.StateDir, MeshStateFile)
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	var saved savedMesh
	if err == nil {
		err = json.Unmarshal(data, &saved)
	}
	if err == nil && saved.Version != meshStateVersion {
		err = errors.New("saved by an older Sailplane, which did not record the mesh file")
	}
	m := &meshv1alpha1.MeshConfig{}
	if err == nil {
		err = protojson.Unmarshal(saved.Mesh, m)
	}
	if err != nil {
		s.log.Warn("saved mesh config ignored", "file", path, "error", err)
		return nil
	}
	if own := absPath(s.cfg.MeshFile); saved.MeshFile != own {
		s.log.Info("saved mesh config ignored: it is another mesh file's", "file", path, "saved-for", saved.MeshFile, "mesh-config", own)
		return nil
	}
	return m
}

// saveMesh saves m as the last good mesh config of the mesh file; failing to is logged.
func (s *Service) saveMesh(m *meshv1alpha1.MeshConfig) {
	if s.cfg.StateDir == "" || s.cfg.MeshFile == "" {
		return
	}
	path := filepath.Join(s.cfg.StateDir, MeshStateFile)
	body, err := protojson.Marshal(m)
	var data []byte
	if err == nil {
		data, err = json.Marshal(savedMesh{Version: meshStateVersion, MeshFile: absPath(s.cfg.MeshFile), Mesh: body})
	}
	if err == nil {
		err = statefile.WriteAtomic(path, data)
	}
	if err != nil {
		s.log.Warn("cannot save the mesh config: after a restart, a mesh file that cannot be loaded then stops config-ingest", "file", path, "error", err)
	}
}

// sources returns the folders to read: Config.ConfigDirs, else the mesh config's fs://
// sources (its "conf" folder when it names none), with an error listing the sources that
// cannot be read at all.
func (s *Service) sources(m *meshv1alpha1.MeshConfig) ([]string, error) {
	var dirs []string
	var err error
	if len(s.cfg.ConfigDirs) > 0 {
		dirs = s.cfg.ConfigDirs
	} else {
		dirs, err = mesh.ConfigSourceDirs(m, filepath.Dir(s.cfg.MeshFile))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	// Keep the mesh file's reload error, replace the config-source one.
	kept := s.meshProblems[:0:0]
	for _, p := range s.meshProblems {
		var ue *mesh.UnsupportedSourcesError
		if !errors.As(p, &ue) {
			kept = append(kept, p)
		}
	}
	s.meshProblems = kept
	if err != nil {
		s.meshProblems = append(s.meshProblems, err)
	}
	out := make([]string, len(dirs))
	for i, d := range dirs {
		out[i] = filepath.Clean(d)
	}
	return out, err
}

// absPath is p made absolute; p itself when the working folder cannot be known.
func absPath(p string) string {
	if abs, err := filepath.Abs(p); err == nil {
		return abs
	}
	return p
}

func (s *Service) setProblems(p []error) {
	s.mu.Lock()
	s.treeProblems = p
	s.mu.Unlock()
}
