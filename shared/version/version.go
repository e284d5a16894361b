// Package version says which build of Sailplane a binary is: the version stamped at link time
// (make build, the images) or, without one, what the Go toolchain recorded (module version, VCS
// revision). Every binary prints it with its `version` subcommand and every gRPC server sends it
// to its clients in response headers (see shared/grpcserver).
package version

import (
	"cmp"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
)

// Version is set at link time: go build -ldflags "-X sailplane.dev/shared/version.Version=v1.2.3".
// Empty: Get derives one from the build info.
var Version string

// Component names the running binary (hyper, xds-server …): cli.Execute sets it to the root
// command's name; empty means the executable's file name.
var Component string

// Unknown is the version of a binary built without a stamp or VCS information (go test, or
// -buildvcs=false).
const Unknown = "unknown"

// Info is one binary's version, as `version -o json` prints it and as sailplanectl collects it
// from servers.
type Info struct {
	Component string `json:"component"`
	Version   string `json:"version"`
	// Revision is the VCS commit the binary was built from, with "-dirty" when the tree had
	// uncommitted changes; empty when not recorded.
	Revision  string `json:"revision,omitempty"`
	GoVersion string `json:"goVersion,omitempty"`
}

var buildInfo = sync.OnceValue(func() Info {
	info := Info{GoVersion: runtime.Version()}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return info
	}
	info.GoVersion = bi.GoVersion
	var revision, modified string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			revision = s.Value
		case "vcs.modified":
			modified = s.Value
		}
	}
	if revision != "" {
		if len(revision) > 12 {
			revision = revision[:12]
		}
		if modified == "true" {
			revision += "-dirty"
		}
		info.Revision = revision
	}
	// A binary of a workspace module reports "(devel)"; only a real module version says something.
	if v := bi.Main.Version; v != "" && v != "(devel)" {
		info.Version = v
	}
	return info
})

// Get returns this binary's version: Version when stamped, else the module version, else the VCS
// revision, else Unknown.
func Get() Info {
	info := buildInfo()
	info.Component = cmp.Or(Component, filepath.Base(os.Args[0]))
	info.Version = cmp.Or(Version, info.Version, info.Revision, Unknown)
	return info
}

// String is the one-line form: "hyper v1.2.3 (revision 0123abcd, go1.26.0)".
func (i Info) String() string {
	s := i.Component + " " + i.Version
	var extra []string
	if i.Revision != "" && i.Revision != i.Version {
		extra = append(extra, "revision "+i.Revision)
	}
	if i.GoVersion != "" {
		extra = append(extra, i.GoVersion)
	}
	if len(extra) > 0 {
		s += " (" + strings.Join(extra, ", ") + ")"
	}
	return s
}
