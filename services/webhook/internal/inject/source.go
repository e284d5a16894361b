package inject

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/fsnotify/fsnotify"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"sailplane.dev/shared/fswatch"
)

// configMapSource watches the injection ConfigMap. A ConfigMap that does not exist, or is
// deleted, means the built-in templates; a key it lacks means that key's built-in default.
type configMapSource struct {
	client          kubernetes.Interface
	namespace, name string
	log             *slog.Logger
}

func (s *configMapSource) Run(ctx context.Context, update func(rawTemplates)) error {
	origin := fmt.Sprintf("ConfigMap %s/%s", s.namespace, s.name)
	cms := s.client.CoreV1().ConfigMaps(s.namespace)
	only := fields.OneTermEqualSelector("metadata.name", s.name).String()
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = only
			return cms.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = only
			return cms.Watch(ctx, o)
		},
	}
	fromConfigMap := func(obj any) {
		cm, ok := obj.(*corev1.ConfigMap)
		if !ok {
			return
		}
		raw := rawTemplates{origin: origin}
		if v, ok := cm.Data["config"]; ok {
			raw.config = []byte(v)
		}
		if v, ok := cm.Data["values"]; ok {
			raw.values = []byte(v)
		}
		update(raw)
	}
	builtIn := func() { update(rawTemplates{origin: origin + " (absent: built-in templates)"}) }
	store, informer := cache.NewInformerWithOptions(cache.InformerOptions{
		ListerWatcher: lw,
		ObjectType:    &corev1.ConfigMap{},
		Handler: cache.ResourceEventHandlerFuncs{
			AddFunc:    fromConfigMap,
			UpdateFunc: func(_, obj any) { fromConfigMap(obj) },
			DeleteFunc: func(any) {
				s.log.Warn("injection ConfigMap deleted, using the built-in templates", "configmap", origin)
				builtIn()
			},
		},
	})
	synced := make(chan struct{})
	go func() {
		if cache.WaitForCacheSync(ctx.Done(), informer.HasSynced) && len(store.List()) == 0 {
			s.log.Info("no injection ConfigMap, using the built-in templates", "configmap", origin)
			builtIn()
		}
		close(synced)
	}()
	informer.RunWithContext(ctx)
	<-synced
	return nil
}

// folderSource watches the files `config` and `values` of a folder. A file that does not exist
// means its built-in default (so a missing folder means the built-in templates); one that cannot
// be read keeps the templates in use.
type folderSource struct {
	dir string
	log *slog.Logger
}

// settle is how long the folder must stay quiet before it is read again: editors and ConfigMap
// mounts write in several steps.
const settle = 100 * time.Millisecond

func (s *folderSource) Run(ctx context.Context, update func(rawTemplates)) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("injection templates: %w", err)
	}
	defer w.Close()
	// The folder is watched, not the files (editors rename new files over old ones, a mounted
	// ConfigMap swaps a symlink), and its parent too, so a folder created later is seen.
	watching := false
	watchDir := func() {
		if !watching && w.Add(s.dir) == nil {
			watching = true
		}
	}
	parent := filepath.Dir(filepath.Clean(s.dir))
	if err := w.Add(parent); err != nil {
		// Without even the parent folder, nothing can appear to watch: the built-in templates.
		s.log.Warn("injection templates: folder not watchable, using the built-in templates", "dir", s.dir, "error", err)
		update(rawTemplates{origin: "built-in (" + s.dir + " not watchable)"})
		<-ctx.Done()
		return nil
	}
	watchDir()
	s.read(update)

	dir := filepath.Clean(s.dir)
	fswatch.Settle(ctx, w, settle,
		func(ev fsnotify.Event) bool {
			name := filepath.Clean(ev.Name)
			if filepath.Dir(name) != dir && name != dir {
				return false // something else beside the folder
			}
			if name == dir && ev.Has(fsnotify.Remove|fsnotify.Rename) {
				watching = false
			}
			return true
		},
		func() {
			watchDir()
			s.read(update)
		},
		func(err error) { s.log.Warn("injection templates: watch error", "dir", s.dir, "error", err) })
	return nil
}

func (s *folderSource) read(update func(rawTemplates)) {
	raw := rawTemplates{origin: "folder " + s.dir}
	for _, f := range []struct {
		name string
		to   *[]byte
	}{{"config", &raw.config}, {"values", &raw.values}} {
		path := filepath.Join(s.dir, f.name)
		data, err := os.ReadFile(path)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			// nil: the built-in default.
		case err != nil:
			s.log.Error("injection templates not reloaded, keeping the previous ones", "file", path, "error", err)
			return
		default:
			*f.to = data
		}
	}
	update(raw)
}
