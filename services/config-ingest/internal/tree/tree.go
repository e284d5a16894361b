// Package tree keeps the Istio config read from folders of YAML files: it rescans them, reparses
// only the files whose content changed, resolves conflicts between files, and computes what to
// publish since the last scan. It knows nothing of fsnotify or the bus transport.
//
// What cannot be read is unknown, never empty: a folder, subfolder, file or symlink that cannot
// be read keeps what it last published, and so do the previous folders while a new one cannot be
// read. A resource is deleted only when a readable file positively no longer defines it.
package tree

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/config"
	gwvalidation "sailplane.dev/shared/gatewayapi/validation"
	"sailplane.dev/shared/schema"
)

// ErrDuplicate: two documents define the same kind, namespace and name; the first one wins.
var ErrDuplicate = errors.New("duplicate resource")

// ErrEmpty: a file that held resources is now empty; they are kept. Deleting the file, or leaving
// only a comment in it, removes them.
var ErrEmpty = errors.New("file is empty, keeping the resources it held (delete the file, or leave a comment in it, to remove them)")

// ErrSettling: a file written in place now defines fewer documents or resources than before,
// as a file being written does halfway; its new content is applied once it stays the same for
// the settle window. A file replaced by a rename is applied at once.
var ErrSettling = errors.New("file shrank, possibly a write in progress: its new content waits until it stays unchanged (replace files by an atomic rename to avoid the wait)")

// ErrDiskFull: a file written in place shrank while its filesystem has no space left, as a
// write that failed for want of room leaves it, cut short for good: its removals wait until
// there is room again (and the file can be saved whole).
var ErrDiskFull = errors.New("file shrank while its filesystem is full, possibly a write that failed: keeping what it held until there is room")

// ErrUnreadable: a folder, file or symlink under the config folders cannot be read; what it held
// stays published.
var ErrUnreadable = errors.New("cannot be read, keeping what it held")

// DefaultSettle is how long a shrunk file must stay unchanged before its removals are published.
const DefaultSettle = time.Second

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
	settle    time.Duration
	now       func() time.Time
	diskFull  func(path string) bool

	files     map[string]*file
	published map[Key]config.Config
	// roots are the folders of the last scan that could read every source; while a new source
	// cannot be read, what the previous roots published stays.
	roots    []string
	scanned  []string        // the roots of the last scan
	logged   map[string]bool // scan problems already logged, so each is logged once while it lasts
	problems []error
	dirs     []string
	settleAt time.Time
}

type file struct {
	content []byte
	docs    int // non-empty documents in content
	order   []Key
	valid   map[Key]config.Config
	// problems and warnings of the last parse; kept while the content does not change.
	problems []error
	warnings []string
	// shrunk is newer content defining fewer documents or resources than content, seen first
	// at shrunkAt: held back until it stays the same for the settle window.
	shrunk   []byte
	shrunkAt time.Time
	// restored: read from a saved state, content unknown until the file is read again.
	restored bool
	// id is the file read (device and inode), zero when unknown: new content under a new id was
	// written whole and renamed into place, never halfway.
	id fileID
	// saved is the encoding of valid for the saved state, made once when first needed.
	saved json.RawMessage
}

type fileID struct{ dev, ino uint64 }

// readFile returns the content of the file at p and which file it was.
func readFile(p string) ([]byte, fileID, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, fileID{}, err
	}
	defer f.Close()
	var id fileID
	if fi, err := f.Stat(); err == nil {
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			id = fileID{dev: uint64(st.Dev), ino: st.Ino}
		}
	}
	data, err := io.ReadAll(f)
	return data, id, err
}

func (f *file) add(k Key, c config.Config) {
	if _, ok := f.valid[k]; ok {
		return
	}
	f.valid[k] = c
	f.order = append(f.order, k)
}

// Option configures a Tree.
type Option func(*Tree)

// WithSettle sets how long a file that shrank must stay unchanged before its new content is
// applied (default DefaultSettle).
func WithSettle(d time.Duration) Option { return func(t *Tree) { t.settle = d } }

// WithClock sets the clock (default time.Now), for tests.
func WithClock(now func() time.Time) Option { return func(t *Tree) { t.now = now } }

// WithDiskFull sets how a file's filesystem is found full (default: statfs says no block is
// available), for tests.
func WithDiskFull(full func(path string) bool) Option { return func(t *Tree) { t.diskFull = full } }

// diskFull reports whether the filesystem holding path has no block left for unprivileged
// writers (a write that hit ENOSPC left it so).
func diskFull(path string) bool {
	var st syscall.Statfs_t
	return syscall.Statfs(path, &st) == nil && st.Bavail == 0
}

// New returns an empty Tree; resources without a namespace go to defaultNS.
func New(defaultNS string, logger *slog.Logger, opts ...Option) *Tree {
	t := &Tree{
		defaultNS: defaultNS,
		logger:    logger,
		settle:    DefaultSettle,
		now:       time.Now,
		diskFull:  diskFull,
		files:     map[string]*file{},
		published: map[Key]config.Config{},
		logged:    map[string]bool{},
	}
	for _, o := range opts {
		o(t)
	}
	return t
}

// Problems returns the current problems: documents that could not be read or are invalid,
// duplicates, unreadable folders, files and symlinks, files held back as writes in progress.
func (t *Tree) Problems() []error { return slices.Clone(t.problems) }

// Dirs returns the folders to watch after the last scan: every folder read (symlinks resolved)
// and the folders of symlinked files' targets.
func (t *Tree) Dirs() []string { return slices.Clone(t.dirs) }

// SettleAt returns when a file held back as a possible write in progress is due to be re-read,
// zero when none is.
func (t *Tree) SettleAt() time.Time { return t.settleAt }

// Published returns the resources the last scan settled on.
func (t *Tree) Published() map[Key]config.Config { return t.published }

// Scan reads the *.yaml and *.yml files under roots (recursively, following symlinks, skipping
// hidden entries such as Kubernetes' "..data" folders), reparses those whose content changed,
// and returns what changed since the previous scan, per type, for the types of
// schema.ConfigKinds. unreadableSources are sources that cannot be read at all (an unsupported
// scheme): like a root that cannot be read, they keep the previous roots' resources published.
func (t *Tree) Scan(roots []string, unreadableSources ...error) []Change {
	now := t.now()
	w := &walker{visited: map[string]bool{}, dirs: map[string]bool{}}
	complete := len(unreadableSources) == 0
	for _, err := range unreadableSources {
		w.note("config source cannot be read, keeping what the previous sources published", "", err)
	}
	roots = slices.Clone(roots)
	for i, root := range roots {
		root = filepath.Clean(root)
		roots[i] = root
		if err := w.dir(root); err != nil {
			// A folder that vanished or cannot be read keeps its resources: losing config because
			// a mount is briefly missing would be worse than serving it a little longer.
			complete = false
			w.unreadable(root, "cannot read config folder, keeping its resources", err)
		}
	}
	if !complete {
		// The previous roots' files stay until every new source can be read.
		for _, r := range t.roots {
			if !slices.Contains(roots, r) {
				w.unknown = append(w.unknown, r)
			}
		}
	} else {
		t.roots = slices.Clone(roots)
	}
	t.scanned = roots

	t.settleAt = time.Time{}
	files := make(map[string]*file, len(w.paths))
	problems := w.problems
	for _, p := range w.paths {
		f, err := t.read(p, now)
		if err != nil {
			problems = append(problems, err)
			if !errors.Is(err, ErrSettling) {
				w.notes = append(w.notes, note{err: err})
			}
		}
		if f != nil {
			files[p] = f
		}
	}
	// Files not seen but under a path that could not be read: keep what they held.
	paths := w.paths
	for _, p := range slices.Sorted(maps.Keys(t.files)) {
		if _, ok := files[p]; ok {
			continue
		}
		for _, u := range w.unknown {
			if p == u || strings.HasPrefix(p, u+string(filepath.Separator)) {
				// Not read: when it is seen again, it may have been recreated and be halfway
				// written, so a new inode then proves nothing.
				t.files[p].id = fileID{}
				files[p] = t.files[p]
				paths = append(paths, p)
				break
			}
		}
	}
	t.files = files
	t.dirs = slices.Sorted(maps.Keys(w.dirs))
	changes, conflicts := t.settleFiles(paths, problems)
	t.logOnce(append(w.notes, conflicts...))
	return changes
}

// read returns the file at p's new state: its previous state when it cannot be read now, or is
// emptied, or shrank less than the settle window ago; nil when it is new and unreadable.
func (t *Tree) read(p string, now time.Time) (*file, error) {
	prev := t.files[p]
	data, id, err := readFile(p)
	switch {
	case err != nil:
		// Unreadable (or removed between walk and read): keep what it held, and forget which
		// file it was (see the unread files in Scan).
		if prev != nil {
			prev.id = fileID{}
		}
		return prev, &config.Error{File: p, Err: fmt.Errorf("%w: %w", ErrUnreadable, err)}
	case prev != nil && !prev.restored && bytes.Equal(prev.content, data):
		prev.shrunk = nil // a write in progress that ended where it started
		prev.id = id
		return prev, nil
	case prev != nil && len(prev.valid) > 0 && len(bytes.TrimSpace(data)) == 0:
		// Editors that write in place truncate first: an empty file is taken as a write in
		// progress (the write brings another event), never as "delete everything it held".
		return prev, &config.Error{File: p, Err: ErrEmpty}
	}
	f := t.parse(p, data, prev)
	f.id = id
	// A file replaced by a rename was written whole: only one written in place can be halfway.
	replaced := prev != nil && prev.id != (fileID{}) && prev.id != id
	if prev != nil && !replaced && shrinks(prev, f) {
		if !bytes.Equal(prev.shrunk, data) {
			prev.shrunk, prev.shrunkAt = data, now
			t.logger.Info("config file shrank, holding its removals in case it is being written", "file", p, "settle", t.settle)
		}
		due, why := prev.shrunkAt.Add(t.settle), ErrSettling
		if !now.Before(due) && t.diskFull(p) {
			// Held until there is room again, checked every settle window.
			due, why = now.Add(t.settle), ErrDiskFull
		}
		if now.Before(due) {
			if t.settleAt.IsZero() || due.Before(t.settleAt) {
				t.settleAt = due
			}
			return prev, &config.Error{File: p, Err: why}
		}
	}
	for _, e := range f.problems {
		t.log(e)
	}
	for _, w := range f.warnings {
		t.logger.Warn("config warning", "warning", w)
	}
	return f, nil
}

// shrinks reports whether f defines fewer documents, or drops a resource, compared with prev.
func shrinks(prev, f *file) bool {
	if f.docs < prev.docs {
		return true
	}
	for _, k := range prev.order {
		if _, ok := f.valid[k]; !ok {
			return true
		}
	}
	return false
}

// parse reads one file's content. prev is the file's previous state, used to keep the last
// valid version of what cannot be read now.
func (t *Tree) parse(path string, data []byte, prev *file) *file {
	f := &file{content: data, docs: len(config.SplitDocuments(data)), valid: map[Key]config.Config{}}
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
			f.warnings = append(f.warnings, w.String())
		}
		if err == nil && c.Kind.Group == schema.GatewayAPIGroup {
			// As the API server would: the CRD's schema and rules, and its defaults set.
			c, err = gwvalidation.Validate(c)
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
	return f
}

func duplicate(c config.Config, first config.Source) *config.Error {
	return &config.Error{
		File: c.Source.File, Doc: c.Source.Doc, Kind: c.Kind.Kind, Group: c.Kind.Group, Namespace: c.Namespace, Name: c.Name,
		Err: fmt.Errorf("%w: already defined in %s document %d, which wins", ErrDuplicate, first.File, first.Doc),
	}
}

// keyOf returns the resource an error is about, when the document got that far.
func keyOf(err error) (Key, bool) {
	var ce *config.Error
	if !errors.As(err, &ce) || ce.Name == "" {
		return Key{}, false
	}
	// Istio's kinds first: an error that does not know its group ("Gateway") is Istio's, as
	// before the Gateway API was read.
	for _, k := range schema.ConfigKinds {
		if k.Kind != ce.Kind || (ce.Group != "" && k.Group != ce.Group) {
			continue
		}
		if k.ClusterScoped {
			return Key{k.TypeURL, ce.Name}, true
		}
		return Key{k.TypeURL, schema.Name(ce.Namespace, ce.Name)}, true
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

// logOnce logs the scan's notes that the previous scan did not have: a problem that lasts is
// logged when it appears, not at every rescan.
func (t *Tree) logOnce(notes []note) {
	logged := make(map[string]bool, len(notes))
	for _, n := range notes {
		key := n.msg + "\x00" + n.path + "\x00" + fmt.Sprint(n.err)
		logged[key] = true
		if t.logged[key] {
			continue
		}
		if n.msg == "" {
			t.log(n.err)
			continue
		}
		attrs := []any{"error", n.err}
		if n.path != "" {
			attrs = append([]any{"path", n.path}, attrs...)
		}
		t.logger.Warn(n.msg, attrs...)
	}
	t.logged = logged
}

// settleFiles picks, for every resource, the first file (in paths order) defining it, and diffs
// the result against what was published. It returns the changes and the conflicts between files,
// to be logged once.
func (t *Tree) settleFiles(paths []string, problems []error) ([]Change, []note) {
	desired := map[Key]config.Config{}
	var conflicts []note
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
				conflicts = append(conflicts, note{err: err})
				continue
			}
			desired[k] = c
		}
	}
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
	for _, k := range schema.ConfigKinds {
		if c, ok := byType[k.TypeURL]; ok {
			slices.SortFunc(c.Upsert, func(a, b *bus.Resource) int { return strings.Compare(a.Name, b.Name) })
			slices.Sort(c.Delete)
			out = append(out, *c)
		}
	}
	return out, conflicts
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
