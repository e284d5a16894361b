package configingest_test

import (
	"testing"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/client-go/rest"

	configingest "sailplane.dev/services/config-ingest"
)

// The state folder follows the mesh file (beside its etc/sailplane), not the working folder;
// an explicit --state-dir wins, "" included.
func TestStateDirDefault(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		kube bool
		want string
	}{
		{"default mesh file", nil, false, "var/lib/sailplane"},
		{"mesh file elsewhere", []string{"--mesh-config=/srv/a/etc/sailplane/mesh.yaml"}, false, "/srv/a/var/lib/sailplane"},
		{"second mesh file, same folder", []string{"--mesh-config=/srv/a/etc/sailplane/other.yaml"}, false, "/srv/a/var/lib/sailplane"},
		{"mesh file outside etc/sailplane", []string{"--mesh-config=/tmp/x/mesh.yaml"}, false, "/tmp/x/var/lib/sailplane"},
		{"relative mesh file", []string{"--mesh-config=b/etc/sailplane/mesh.yaml"}, false, "b/var/lib/sailplane"},
		{"explicit", []string{"--mesh-config=/srv/a/etc/sailplane/mesh.yaml", "--state-dir=/state"}, false, "/state"},
		{"off", []string{"--mesh-config=/srv/a/etc/sailplane/mesh.yaml", "--state-dir="}, false, ""},
		{"kubernetes", nil, true, "var/lib/sailplane"},
		{"kubernetes with a mesh file", []string{"--mesh-config=/srv/a/etc/sailplane/mesh.yaml"}, true, "/srv/a/var/lib/sailplane"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var cfg configingest.Config
			fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
			cfg.AddFlags(fs)
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			var kube *rest.Config
			if tc.kube {
				kube = &rest.Config{Host: "https://127.0.0.1:6443"}
			}
			cfg.UseSource(kube, fs)
			if cfg.StateDir != tc.want {
				t.Errorf("state dir %q, want %q", cfg.StateDir, tc.want)
			}
		})
	}
}

// --upstream-sync-timeout sets how long the first state waits for an xds:// source; 10 s by default.
func TestUpstreamSyncTimeoutFlag(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want time.Duration
	}{
		{nil, 10 * time.Second},
		{[]string{"--upstream-sync-timeout=2m"}, 2 * time.Minute},
	} {
		var cfg configingest.Config
		fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
		cfg.AddFlags(fs)
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		if cfg.UpstreamSyncTimeout != tc.want {
			t.Errorf("%v: timeout %v, want %v", tc.args, cfg.UpstreamSyncTimeout, tc.want)
		}
	}
}
