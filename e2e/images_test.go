package e2e

import (
	"bufio"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// There is no container engine where the tests run: these tests check what can be checked of
// the images without one, from the files docker and skaffold read.

// dockerfileCopy is one COPY instruction of the build context (not --from another stage).
type dockerfileCopy struct {
	line    int
	sources []string
}

// readDockerfile returns deploy/Dockerfile's context COPYs and the line of `RUN go mod download`.
func readDockerfile(t *testing.T) (copies []dockerfileCopy, downloadLine int) {
	t.Helper()
	f, err := os.Open("../deploy/Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		fields := strings.Fields(sc.Text())
		switch {
		case len(fields) >= 3 && fields[0] == "COPY" && !strings.HasPrefix(fields[1], "--from"):
			copies = append(copies, dockerfileCopy{line: n, sources: fields[1 : len(fields)-1]})
		case strings.Join(fields, " ") == "RUN go mod download":
			downloadLine = n
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if downloadLine == 0 {
		t.Fatal("deploy/Dockerfile: no `RUN go mod download` layer")
	}
	return copies, downloadLine
}

// workspaceModules are the folders go.work uses.
func workspaceModules(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile("../go.work")
	if err != nil {
		t.Fatal(err)
	}
	var dirs []string
	inUse := false
	for line := range strings.Lines(string(data)) {
		line = strings.TrimSpace(line)
		switch {
		case line == "use (":
			inUse = true
		case inUse && line == ")":
			inUse = false
		case inUse && line != "":
			dirs = append(dirs, path.Clean(line))
		}
	}
	if len(dirs) == 0 {
		t.Fatal("go.work uses no module")
	}
	return dirs
}

// dockerignored tells whether .dockerignore leaves p (slash-separated, relative to the root)
// out of the build context: the last matching pattern decides, a pattern also covers what is
// under a matching folder, and `!` re-includes.
func dockerignored(patterns []string, p string) bool {
	ignored := false
	for _, pat := range patterns {
		include := strings.HasPrefix(pat, "!")
		pat = strings.TrimPrefix(pat, "!")
		for q := p; q != "."; q = path.Dir(q) {
			if matchDockerPattern(pat, q) {
				ignored = !include
				break
			}
		}
	}
	return ignored
}

// matchDockerPattern matches Go's path.Match, with a leading **/ standing for any folders.
func matchDockerPattern(pat, p string) bool {
	if rest, ok := strings.CutPrefix(pat, "**/"); ok {
		for q := p; ; {
			if ok, _ := path.Match(rest, q); ok {
				return true
			}
			_, after, found := strings.Cut(q, "/")
			if !found {
				return false
			}
			q = after
		}
	}
	ok, _ := path.Match(pat, p)
	return ok
}

func readDockerignore(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile("../.dockerignore")
	if err != nil {
		t.Fatal(err)
	}
	var patterns []string
	for line := range strings.Lines(string(data)) {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
			patterns = append(patterns, path.Clean(line))
		}
	}
	return patterns
}

// TestDockerfileCopies checks deploy/Dockerfile against the repository: every path it copies
// exists and is in the build context (.dockerignore), every module of go.work has its go.mod and
// go.sum copied before the module-download layer (so that layer is rebuilt only when they
// change, and `go mod download` finds the whole workspace), and the sources come after it.
func TestDockerfileCopies(t *testing.T) {
	copies, downloadLine := readDockerfile(t)
	ignore := readDockerignore(t)
	before := map[string]bool{}
	for _, c := range copies {
		for _, src := range c.sources {
			if _, err := os.Stat(filepath.Join("..", filepath.FromSlash(src))); err != nil {
				t.Errorf("deploy/Dockerfile:%d: COPY %s: %v", c.line, src, err)
			}
			if dockerignored(ignore, path.Clean(src)) {
				t.Errorf("deploy/Dockerfile:%d: COPY %s: .dockerignore leaves it out of the build context", c.line, src)
			}
			if c.line < downloadLine {
				before[path.Clean(src)] = true
				if base := path.Base(src); base != "go.mod" && base != "go.sum" && base != "go.work" && base != "go.work.sum" {
					t.Errorf("deploy/Dockerfile:%d: COPY %s before the module download: every source edit would download again", c.line, src)
				}
			}
		}
	}
	for _, f := range []string{"go.work", "go.work.sum"} {
		if !before[f] {
			t.Errorf("deploy/Dockerfile: %s is not copied before `RUN go mod download`", f)
		}
	}
	for _, dir := range workspaceModules(t) {
		for _, f := range []string{"go.mod", "go.sum"} {
			if !before[path.Join(dir, f)] {
				t.Errorf("deploy/Dockerfile: %s/%s (go.work uses %s) is not copied before `RUN go mod download`", dir, f, dir)
			}
		}
	}
	for _, keep := range []string{"services/hyper/cmd/main.go", "shared/go.mod", "e2e/go.mod"} {
		if dockerignored(ignore, keep) {
			t.Errorf(".dockerignore leaves %s out of the build context", keep)
		}
	}
	for _, drop := range []string{".git", "bin/hyper", "var/lib/sailplane", "docs/benchmarks.md", "e2e/deploy_test.go", "shared/bus/bus_test.go", "services/ca/testdata/x"} {
		if !dockerignored(ignore, drop) {
			t.Errorf(".dockerignore keeps %s in the build context", drop)
		}
	}
}

type skaffoldConfig struct {
	Build struct {
		Artifacts []struct {
			Image  string
			Docker struct {
				Dockerfile string
				BuildArgs  map[string]string `json:"buildArgs"`
			}
		}
	}
	Manifests struct {
		Kustomize struct{ Paths []string }
	}
	Profiles []struct {
		Name      string
		Manifests struct {
			Kustomize struct{ Paths []string }
		}
	}
}

// TestDockerfileStampsVersion checks that the build stamps $VERSION into the variable the
// binaries' `version` subcommand prints.
func TestDockerfileStampsVersion(t *testing.T) {
	dockerfile, err := os.ReadFile("../deploy/Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	const stamp = "-X sailplane.dev/shared/version.Version=${VERSION}"
	if !strings.Contains(string(dockerfile), stamp) || !strings.Contains(string(dockerfile), "ARG VERSION") {
		t.Errorf("deploy/Dockerfile does not build with %s from ARG VERSION", stamp)
	}
	pkg, err := os.ReadFile("../shared/version/version.go")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(pkg), "\nvar Version string\n") {
		t.Error("shared/version has no `var Version string` for -X to set")
	}
}

// TestSkaffold checks skaffold.yaml: one artifact per binary, each built by deploy/Dockerfile
// from a main that exists and stamped with a version, every image the overlays run among them,
// and a profile for every overlay.
func TestSkaffold(t *testing.T) {
	data, err := os.ReadFile("../skaffold.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var cfg skaffoldConfig
	if err := yaml.Unmarshal(data, &cfg); err != nil {
		t.Fatalf("skaffold.yaml: %v", err)
	}
	built := map[string]bool{}
	for _, a := range cfg.Build.Artifacts {
		service := a.Docker.BuildArgs["SERVICE"]
		built[a.Image] = true
		if a.Docker.Dockerfile != "deploy/Dockerfile" {
			t.Errorf("skaffold.yaml: %s: dockerfile %q, want deploy/Dockerfile", a.Image, a.Docker.Dockerfile)
		}
		if _, err := os.Stat(filepath.Join("..", "services", service, "cmd", "main.go")); err != nil {
			t.Errorf("skaffold.yaml: %s: SERVICE %q: %v", a.Image, service, err)
		}
		if a.Docker.BuildArgs["VERSION"] == "" {
			t.Errorf("skaffold.yaml: %s: no VERSION build arg", a.Image)
		}
	}
	services, err := os.ReadDir("../services")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range services {
		if !built["sailplane/"+s.Name()] {
			t.Errorf("skaffold.yaml: no artifact sailplane/%s for services/%s", s.Name(), s.Name())
		}
	}
	profiles := map[string][]string{"": cfg.Manifests.Kustomize.Paths}
	for _, p := range cfg.Profiles {
		profiles[p.Name] = p.Manifests.Kustomize.Paths
	}
	if !slices.Equal(profiles[""], []string{"deploy/hyper"}) {
		t.Errorf("skaffold.yaml: default manifests %v, want [deploy/hyper]", profiles[""])
	}
	for _, overlay := range deployOverlays {
		paths, ok := profiles[overlay]
		if !ok || !slices.Contains(paths, "deploy/"+overlay) {
			t.Errorf("skaffold.yaml: no profile %s deploying deploy/%s (got %v)", overlay, overlay, paths)
		}
		for _, obj := range kustomizeBuild(t, overlay) {
			tmpl, ok := podTemplate(t, obj)
			if !ok {
				continue
			}
			for _, c := range slices.Concat(tmpl.Spec.InitContainers, tmpl.Spec.Containers) {
				if strings.HasPrefix(c.Image, "sailplane/") && !built[c.Image] {
					t.Errorf("deploy/%s: %s runs %s, which skaffold.yaml does not build", overlay, ref(obj), c.Image)
				}
			}
		}
	}
}
