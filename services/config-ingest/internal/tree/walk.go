package tree

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"sailplane.dev/shared/config"
)

// errAlreadyRead: a folder reached a second time, through a symlink.
var errAlreadyRead = errors.New("already read through another path (a symlink loop, or two links to one folder)")

// walker lists the config files under a set of roots, following symlinks.
type walker struct {
	paths    []string
	dirs     map[string]bool // real folders to watch
	visited  map[string]bool // real folders already read
	unknown  []string        // paths that could not be read: what they held stays
	problems []error
	notes    []note
}

// note is something to log once while it lasts.
type note struct {
	msg  string // empty: err is a config problem, logged as such
	path string
	err  error
}

func (w *walker) note(msg, path string, err error) {
	w.notes = append(w.notes, note{msg: msg, path: path, err: err})
}

// unreadable records a path that could not be read: unknown, never empty.
func (w *walker) unreadable(path, msg string, err error) {
	w.unknown = append(w.unknown, path)
	w.problems = append(w.problems, &config.Error{File: path, Err: fmt.Errorf("%w: %w", ErrUnreadable, err)})
	w.note(msg, path, err)
}

// dir lists the folder at p (as reached, through symlinks or not) and, recursively, its
// subfolders. It fails only when p itself cannot be read.
func (w *walker) dir(p string) error {
	resolved, err := filepath.EvalSymlinks(p)
	if err != nil {
		return err
	}
	if w.visited[resolved] {
		w.note("config folder skipped", p, errAlreadyRead)
		return nil
	}
	w.visited[resolved] = true
	entries, err := os.ReadDir(p)
	if err != nil {
		return err
	}
	w.dirs[resolved] = true
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, ".") {
			continue // hidden, such as Kubernetes' "..data": read through the links into it
		}
		c := filepath.Join(p, name)
		typ := e.Type()
		if typ&fs.ModeSymlink != 0 {
			st, err := os.Stat(c)
			if err != nil {
				// Dangling, or a loop of links. A name without extension may be a folder.
				if isYAML(name) || filepath.Ext(name) == "" {
					w.unreadable(c, "config symlink cannot be followed, keeping what it held", err)
				}
				continue
			}
			typ = st.Mode().Type()
			if typ.IsRegular() && isYAML(name) {
				// Editing a link's target outside the watched folders changes nothing in them:
				// watch the target's folder too.
				if target, err := filepath.EvalSymlinks(c); err == nil {
					w.dirs[filepath.Dir(target)] = true
				}
			}
		}
		switch {
		case typ.IsDir():
			if err := w.dir(c); err != nil {
				w.unreadable(c, "cannot read config folder, keeping its resources", err)
			}
		case !isYAML(name):
		case typ.IsRegular():
			w.paths = append(w.paths, c)
		default:
			w.note("config file skipped", c, fmt.Errorf("not a regular file (%v)", typ))
		}
	}
	return nil
}

func isYAML(name string) bool {
	ext := filepath.Ext(name)
	return ext == ".yaml" || ext == ".yml"
}
