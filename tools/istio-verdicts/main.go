// Command istio-verdicts records what Istio's own validator says about every networking.istio.io
// and security.istio.io document in Istio's source tree (samples and test data), one line per
// document, for shared/config's conformance test (TestIstioConformance):
//
//	go run ./tools/istio-verdicts -istioctl ~/.cache/sailplane/istio/istioctl \
//	    > shared/config/testdata/istio-verdicts.txt
//
// Each document is written to a file of its own and checked with `istioctl validate -f`, which
// works offline: a file that fails to decode stops istioctl at its first bad document, so files
// are never validated whole. Documents are split as Sailplane splits them
// (config.SplitDocuments), so the test finds them by file and index. Go templates ("{{") are
// skipped: they are not Istio config until rendered.
//
// Istio's CRD test data states each document's expected error in a top-level "_err" key, which
// alone makes the document invalid. Such a document is recorded twice: as it is, and without
// its "_err" line (index "N-_err"), so that the rule it was written for is compared too.
package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"

	"sailplane.dev/shared/config"
	"sailplane.dev/shared/schema"
)

// DefaultModule is the Istio source tree the verdicts are taken from: the version Sailplane's
// reference binaries are built from.
const DefaultModule = "istio.io/istio@v0.0.0-20260827124520-eed52ebb66ad"

// maxMessage bounds the recorded message: enough to recognise the rule.
const maxMessage = 160

func main() {
	istioctl := flag.String("istioctl", "istioctl", "the istioctl binary")
	module := flag.String("module", DefaultModule, "the Istio module (path@version) whose YAML is checked")
	workers := flag.Int("j", runtime.NumCPU(), "istioctl processes run at once")
	flag.Parse()
	if err := run(*istioctl, *module, *workers); err != nil {
		fmt.Fprintln(os.Stderr, "istio-verdicts:", err)
		os.Exit(1)
	}
}

// Document is one selected document of the corpus.
type Document struct {
	Path string // slash-separated, relative to the module root
	Doc  string // 1-based index among the file's non-empty documents; "N-_err" without _err
	Text []byte
}

type verdict struct {
	kind    string // valid, warning or error
	message string
}

func run(istioctl, module string, workers int) error {
	dir, err := moduleDir(module)
	if err != nil {
		return err
	}
	docs, err := corpus(dir)
	if err != nil {
		return err
	}
	tmp, err := os.MkdirTemp("", "istio-verdicts")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)

	verdicts := make([]verdict, len(docs))
	errs := make([]error, len(docs))
	var wg sync.WaitGroup
	next := make(chan int)
	for w := range max(workers, 1) {
		wg.Go(func() {
			file := filepath.Join(tmp, fmt.Sprintf("doc%d.yaml", w))
			for i := range next {
				verdicts[i], errs[i] = validate(istioctl, file, docs[i].Text)
			}
		})
	}
	for i := range docs {
		next <- i
	}
	close(next)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}

	var out bytes.Buffer
	fmt.Fprintf(&out, "# Istio's verdict on each networking/security document of %s\n", module)
	fmt.Fprintf(&out, "# (istioctl validate, one document at a time). Regenerate with:\n")
	fmt.Fprintf(&out, "#   go run ./tools/istio-verdicts -istioctl ~/.cache/sailplane/istio/istioctl > shared/config/testdata/istio-verdicts.txt\n")
	fmt.Fprintf(&out, "# Columns: file, document index, sha256 prefix of the document, verdict, Istio's message.\n")
	fmt.Fprintf(&out, "module %s\n", module)
	for i, d := range docs {
		sum := sha256.Sum256(d.Text)
		line := fmt.Sprintf("%s %s %s %s", d.Path, d.Doc, hex.EncodeToString(sum[:6]), verdicts[i].kind)
		if m := verdicts[i].message; m != "" {
			line += " " + m
		}
		out.WriteString(line + "\n")
	}
	_, err = os.Stdout.Write(out.Bytes())
	return err
}

// moduleDir downloads module (a no-op when cached) and returns its directory.
func moduleDir(module string) (string, error) {
	out, err := exec.Command("go", "mod", "download", "-json", module).Output()
	if err != nil {
		return "", fmt.Errorf("go mod download %s: %w", module, err)
	}
	var m struct{ Dir, Error string }
	if err := json.Unmarshal(out, &m); err != nil || m.Dir == "" {
		return "", fmt.Errorf("go mod download %s: %v %s", module, err, m.Error)
	}
	return m.Dir, nil
}

var (
	apiVersionRE = regexp.MustCompile(`(?m)^apiVersion:\s*["']?(networking|security)\.istio\.io/`)
	kindRE       = regexp.MustCompile(`(?m)^kind:\s*["']?([A-Za-z]+)`)
	// errLineRE is the "_err" line of Istio's CRD test data (TestIstioConformance strips it alike).
	errLineRE = regexp.MustCompile(`(?m)^_err:.*\n?`)
)

// corpus lists the documents of dir's YAML files whose apiVersion is an Istio networking or
// security group and whose kind is one Sailplane reads, in path order.
func corpus(dir string) ([]Document, error) {
	kinds := map[string]bool{}
	for _, k := range schema.IstioConfig {
		kinds[k.Kind] = true
	}
	var docs []Document
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || (!strings.HasSuffix(path, ".yaml") && !strings.HasSuffix(path, ".yml")) {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil {
			return err
		}
		for i, doc := range config.SplitDocuments(data) {
			k := kindRE.FindSubmatch(doc)
			if !apiVersionRE.Match(doc) || k == nil || !kinds[string(k[1])] || bytes.Contains(doc, []byte("{{")) {
				continue
			}
			d := Document{Path: filepath.ToSlash(rel), Doc: strconv.Itoa(i + 1), Text: doc}
			docs = append(docs, d)
			if errLineRE.Match(doc) {
				docs = append(docs, Document{Path: d.Path, Doc: d.Doc + "-_err", Text: errLineRE.ReplaceAll(doc, nil)})
			}
		}
		return nil
	})
	slices.SortStableFunc(docs, func(a, b Document) int { return strings.Compare(a.Path, b.Path) })
	return docs, err
}

// validate runs istioctl on doc alone (written to file) and classifies its answer.
func validate(istioctl, file string, doc []byte) (verdict, error) {
	if err := os.WriteFile(file, doc, 0o644); err != nil {
		return verdict{}, err
	}
	cmd := exec.Command(istioctl, "validate", "-f", file)
	// Offline: validation must not depend on whatever cluster the machine knows.
	cmd.Env = append(os.Environ(), "KUBECONFIG="+filepath.Join(filepath.Dir(file), "no-kubeconfig"))
	out, err := cmd.CombinedOutput()
	msg := oneLine(strings.ReplaceAll(string(out), file, "FILE"))
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		return verdict{"error", msg}, nil
	case err != nil:
		return verdict{}, fmt.Errorf("running %s: %w", istioctl, err)
	case strings.Contains(string(out), "has warnings"):
		return verdict{"warning", msg}, nil
	case strings.Contains(string(out), "is valid"):
		return verdict{"valid", ""}, nil
	}
	return verdict{}, fmt.Errorf("unrecognised istioctl output for %s: %s", file, out)
}

// oneLine squeezes istioctl's multi-line message into one bounded line.
func oneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	for _, p := range []string{"Error: 1 error occurred: * ", "Error: ", "\"FILE\" has warnings: * "} {
		s = strings.TrimPrefix(s, p)
	}
	if r := []rune(s); len(r) > maxMessage {
		s = string(r[:maxMessage]) + "…"
	}
	return s
}
