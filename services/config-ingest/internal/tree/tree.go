// Package tree keeps the Istio config read from folders of YAML files: it rescans them, reparses
// only the files whose content changed, resolves conflicts between files, and computes what to
// publish since the last scan. It knows nothing of fsnotify or the bus transport.
package tree

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/config"
	"sailplane.dev/shared/schema"
)

// ErrDuplicate: two documents define the same kind, namespace and name; the first one wins.
var ErrDuplicate = errors.New("duplicate resource")

// ErrEmpty: a file that held resources is now empty; they are kept. Deleting the file, or leaving
// only a comment in it, removes them.
var ErrEmpty = errors.New("file is empty, keeping the resources it held (delete the file, or leave a comment in it, to remove them)")

// Key identifies a resource on the bus.
type Key struct {
	TypeURL string
	Name    string // "namespace/name"
}

// Change is what to publish for one type after a scan.
type Change struct {
	TypeURL string
	Upsert  []*bus.Resource
	Delete  []string
}

// Tree is the state of a set of config folders. It is not safe for concurrent use.
type Tree struct {
	defaultNS string
	logger    *slog.Logger

	files     map[string]*file
	published map[Key]config.Config
	conflicts map[string]bool // messages of the conflicts already logged
	problems  []error
	dirs      []string
}

type file struct {
	content []byte
	order   []Key
	valid   map[Key]config.Config
	// problems of the last parse; kept while the content does not change.
	problems []error
}

func (f *file) add(k Key, c config.Config) {
	if _, ok := f.valid[k]; ok {
		return
	}
	f.valid[k] = c
	f.order = append(f.order, k)
}

// New returns an empty Tree; resources without a namespace go to defaultNS.
func New(defaultNS string, logger *slog.Logger) *Tree {
	return &Tree{
		defaultNS: defaultNS,
		logger:    logger,
		files:     map[string]*file{},
		published: map[Key]config.Config{},
		conflicts: map[string]bool{},
	}
}

// Problems returns the current problems: documents that could not be read or are invalid,
// duplicates, unreadable folders.
func (t *Tree) Problems() []error { return slices.Clone(t.problems) }

// Dirs returns every folder under the roots seen by the last scan, to be watched.
func (t *Tree) Dirs() []string { return slices.Clone(t.dirs) }

// Published returns the resources the last scan settled on.
func (t *Tree) Published() map[Key]config.Config { return t.published }

// Scan reads the *.yaml and *.yml files under roots (recursively, skipping hidden entries such
// as Kubernetes' "..data" folders), reparses those whose content changed, and returns what
// changed since the previous scan, per type, for the types of schema.IstioConfig.
func (t *Tree) Scan(roots []string) []Change {
	var scanProblems []error
	var paths []string
	var dirs []string
	failedRoots := map[string]bool{}
	seen := map[string]bool{}
	for _, root := range roots {
		root = filepath.Clean(root)
		err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				if p == root {
					return err
				}
				scanProblems = append(scanProblems, fmt.Errorf("config folder: %w", err))
				t.logger.Warn("cannot read config path", "path", p, "error", err)
				return nil
			}
			if p != root && strings.HasPrefix(d.Name(), ".") {
				if d.IsDir() {
					return filepath.SkipDir
				}
				return nil
			}
			if d.IsDir() {
				dirs = append(dirs, p)
				return nil
			}
			if ext := filepath.Ext(p); ext != ".yaml" && ext != ".yml" {
				return nil
			}
			if d.Type()&fs.ModeSymlink != 0 {
				if st, err := os.Stat(p); err != nil || !st.Mode().IsRegular() {
					return nil
				}
			}
			if !seen[p] {
				seen[p] = true
				paths = append(paths, p)
			}
			return nil
		})
		if err != nil {
			// A folder that vanished or cannot be read keeps its resources: losing config because
			// a mount is briefly missing would be worse than serving it a little longer.
			failedRoots[root] = true
			scanProblems = append(scanProblems, fmt.Errorf("config folder %s: %w", root, err))
			t.logger.Warn("cannot read config folder, keeping its resources", "dir", root, "error", err)
		}
	}

	files := make(map[string]*file, len(paths))
	for _, p := range paths {
		prev := t.files[p]
		data, err := os.ReadFile(p)
		if err != nil {
			// Unreadable (or removed between walk and read): keep what it held.
			t.logger.Warn("cannot read config file, keeping its resources", "file", p, "error", err)
			if prev != nil {
				files[p] = prev
			}
			scanProblems = append(scanProblems, &config.Error{File: p, Err: err})
			continue
		}
		if prev != nil && bytes.Equal(prev.content, data) {
			files[p] = prev
			continue
		}
		if prev != nil && len(prev.valid) > 0 && len(bytes.TrimSpace(data)) == 0 {
			// Editors that write in place truncate first: an empty file is taken as a write in
			// progress (the write brings another event), never as "delete everything it held".
			files[p] = prev
			scanProblems = append(scanProblems, &config.Error{File: p, Err: ErrEmpty})
			continue
		}
		files[p] = t.parse(p, data, prev)
	}
	for p, f := range t.files {
		if _, ok := files[p]; ok {
			continue
		}
		for root := range failedRoots {
			if strings.HasPrefix(p, root+string(filepath.Separator)) {
				files[p] = f
				paths = append(paths, p)
			}
		}
	}
	t.files = files
	t.dirs = dirs
	return t.settle(paths, scanProblems)
}

// parse reads one file's content. prev is the file's previous state, used to keep the last
// valid version of what cannot be read now.
func (t *Tree) parse(path string, data []byte, prev *file) *file {
	f := &file{content: data, valid: map[Key]config.Config{}}
	cfgs, errs := config.ParseYAML(path, data, t.defaultNS)
	held := map[Key]bool{}
	partial := false
	for _, err := range errs {
		if k, ok := keyOf(err); ok {
			held[k] = true
		} else {
			partial = true
		}
		f.problems = append(f.problems, err)
	}
	for _, c := range cfgs {
		k := Key{c.Kind.TypeURL, c.BusName()}
		if first, dup := f.valid[k]; dup {
			f.problems = append(f.problems, duplicate(c, first.Source))
			continue
		}
		warnings, err := config.Validate(c)
		for _, w := range warnings {
			t.logger.Warn("config warning", "warning", w.String())
		}
		if err != nil {
			for _, e := range config.Errors(err) {
				f.problems = append(f.problems, e)
			}
			held[k] = true
			continue
		}
		f.add(k, c)
	}
	if prev != nil {
		for _, k := range prev.order {
			// A resource that is now invalid keeps its last valid version; a document we cannot
			// even identify (malformed YAML) may have held any of the file's resources, so they
			// all stay.
			if held[k] || partial {
				f.add(k, prev.valid[k])
			}
		}
	}
	for _, p := range f.problems {
		t.log(p)
	}
	return f
}

func duplicate(c config.Config, first config.Source) *config.Error {
	return &config.Error{
		File: c.Source.File, Doc: c.Source.Doc, Kind: c.Kind.Kind, Namespace: c.Namespace, Name: c.Name,
		Err: fmt.Errorf("%w: already defined in %s document %d, which wins", ErrDuplicate, first.File, first.Doc),
	}
}

// keyOf returns the resource an error is about, when the document got that far.
func keyOf(err error) (Key, bool) {
	var ce *config.Error
	if !errors.As(err, &ce) || ce.Name == "" {
		return Key{}, false
	}
	for _, k := range schema.IstioConfig {
		if k.Kind == ce.Kind {
			return Key{k.TypeURL, schema.Name(ce.Namespace, ce.Name)}, true
		}
	}
	return Key{}, false
}

func (t *Tree) log(err error) {
	attrs := []any{"error", err}
	var ce *config.Error
	if errors.As(err, &ce) {
		attrs = append(attrs, "file", ce.File, "doc", ce.Doc, "kind", ce.Kind, "name", schema.Name(ce.Namespace, ce.Name), "field", ce.Field)
	}
	t.logger.Warn("config problem", attrs...)
}

// settle picks, for every resource, the first file (in paths order) defining it, and diffs the
// result against what was published.
func (t *Tree) settle(paths []string, problems []error) []Change {
	desired := map[Key]config.Config{}
	conflicts := map[string]bool{}
	for _, p := range paths {
		f := t.files[p]
		if f == nil {
			continue
		}
		problems = append(problems, f.problems...)
		for _, k := range f.order {
			c := f.valid[k]
			if first, ok := desired[k]; ok {
				err := duplicate(c, first.Source)
				problems = append(problems, err)
				conflicts[err.Error()] = true
				if !t.conflicts[err.Error()] {
					t.log(err)
				}
				continue
			}
			desired[k] = c
		}
	}
	t.conflicts = conflicts
	t.problems = problems

	byType := map[string]*Change{}
	change := func(typeURL string) *Change {
		if c, ok := byType[typeURL]; ok {
			return c
		}
		c := &Change{TypeURL: typeURL}
		byType[typeURL] = c
		return c
	}
	for k, c := range desired {
		if old, ok := t.published[k]; ok && config.Equal(old, c) {
			continue
		}
		ch := change(k.TypeURL)
		ch.Upsert = append(ch.Upsert, c.Resource())
	}
	for k := range t.published {
		if _, ok := desired[k]; !ok {
			ch := change(k.TypeURL)
			ch.Delete = append(ch.Delete, k.Name)
		}
	}
	t.published = desired
	var out []Change
	for _, k := range schema.IstioConfig {
		if c, ok := byType[k.TypeURL]; ok {
			slices.SortFunc(c.Upsert, func(a, b *bus.Resource) int { return strings.Compare(a.Name, b.Name) })
			slices.Sort(c.Delete)
			out = append(out, *c)
		}
	}
	return out
}

// State returns the published resources of one type, sorted by name, for a full Replace.
func (t *Tree) State(typeURL string) []*bus.Resource {
	var out []*bus.Resource
	for k, c := range t.published {
		if k.TypeURL == typeURL {
			out = append(out, c.Resource())
		}
	}
	slices.SortFunc(out, func(a, b *bus.Resource) int { return strings.Compare(a.Name, b.Name) })
	return out
}
