package version

import (
	"bytes"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestLinkerStamp builds a binary the way `make build` does and reads its version back through the
// `version` subcommand cli.Execute adds.
func TestLinkerStamp(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "stamped")
	build := exec.Command("go", "build", "-ldflags", "-X sailplane.dev/shared/version.Version=v1.2.3-test", "-o", bin, "./testdata/stamped")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"version"}, "stamped v1.2.3-test ("},
		{[]string{"version", "-o", "yaml"}, "component: stamped\n"},
		{[]string{"version", "-o", "yaml"}, "version: v1.2.3-test\n"},
	} {
		out, err := exec.Command(bin, tc.args...).CombinedOutput()
		if err != nil {
			t.Fatalf("%v: %v\n%s", tc.args, err, out)
		}
		if !strings.Contains(string(out), tc.want) {
			t.Errorf("%v:\n%s\nwant it to contain %q", tc.args, out, tc.want)
		}
	}
	out, err := exec.Command(bin, "version", "-o", "json").Output()
	if err != nil {
		t.Fatal(err)
	}
	var info Info
	if err := json.Unmarshal(out, &info); err != nil {
		t.Fatalf("-o json: %v\n%s", err, out)
	}
	if info.Version != "v1.2.3-test" || info.Component != "stamped" || !strings.HasPrefix(info.GoVersion, "go1.") {
		t.Errorf("-o json = %+v", info)
	}
}

func TestGet(t *testing.T) {
	for _, tc := range []struct {
		name, stamp, component string
		want                   Info
	}{
		{"stamped", "v2.0.0", "xds-server", Info{Component: "xds-server", Version: "v2.0.0"}},
		// go test records no VCS stamp and a "(devel)" module: nothing says which build this is.
		{"unstamped", "", "ca", Info{Component: "ca", Version: Unknown}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer func(v, c string) { Version, Component = v, c }(Version, Component)
			Version, Component = tc.stamp, tc.component
			got := Get()
			if got.Component != tc.want.Component || got.Version != tc.want.Version && got.Version != got.Revision {
				t.Errorf("Get() = %+v, want component %q and version %q", got, tc.want.Component, tc.want.Version)
			}
		})
	}
}

func TestWrite(t *testing.T) {
	info := Info{Component: "hyper", Version: "v1.0.0", Revision: "0123456789ab-dirty", GoVersion: "go1.26.0"}
	for _, tc := range []struct{ format, want string }{
		{"", "hyper v1.0.0 (revision 0123456789ab-dirty, go1.26.0)\n"},
		{"yaml", "component: hyper\ngoVersion: go1.26.0\nrevision: 0123456789ab-dirty\nversion: v1.0.0\n"},
		{"json", "{\n  \"component\": \"hyper\",\n  \"version\": \"v1.0.0\",\n  \"revision\": \"0123456789ab-dirty\",\n  \"goVersion\": \"go1.26.0\"\n}\n"},
	} {
		var b bytes.Buffer
		if err := Write(&b, tc.format, info); err != nil {
			t.Fatal(err)
		}
		if b.String() != tc.want {
			t.Errorf("%q:\n%s\nwant:\n%s", tc.format, b.String(), tc.want)
		}
	}
	if err := Write(&bytes.Buffer{}, "xml", info); err == nil {
		t.Error("format xml: no error")
	}
}
