package config

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// istioVerdicts is Istio's verdict on every networking/security document of its own source tree,
// recorded with istioctl by tools/istio-verdicts (see the file's header to regenerate it).
const istioVerdicts = "testdata/istio-verdicts.txt"

var errLineRE = regexp.MustCompile(`(?m)^_err:.*\n?`)

type recordedVerdict struct {
	path string
	doc  int
	// withoutErr: the document without its "_err" line, the expected error Istio's CRD test
	// data writes into each document (see tools/istio-verdicts).
	withoutErr bool
	sum        string
	verdict    string // valid, warning or error
	message    string
}

// TestIstioConformance checks that Sailplane accepts exactly the documents Istio accepts, and
// warns where Istio warns, over the several hundred documents of Istio's samples and test data.
// The documents are read from the Istio module (go mod download), the verdicts from the file:
// istioctl is needed only to record them.
func TestIstioConformance(t *testing.T) {
	module, verdicts := readVerdicts(t)
	dir := downloadModule(t, module)
	agree, warnMismatch := 0, 0
	for _, v := range verdicts {
		data, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(v.path)))
		if err != nil {
			t.Fatal(err)
		}
		docs := SplitDocuments(data)
		if v.doc > len(docs) {
			t.Fatalf("%s has %d documents, the verdicts name document %d: regenerate %s", v.path, len(docs), v.doc, istioVerdicts)
		}
		doc := docs[v.doc-1]
		name := strconv.Itoa(v.doc)
		if v.withoutErr {
			doc, name = errLineRE.ReplaceAll(doc, nil), name+" without _err"
		}
		if sum := sha256.Sum256(doc); hex.EncodeToString(sum[:6]) != v.sum {
			t.Fatalf("%s document %s is not the one Istio judged: regenerate %s", v.path, name, istioVerdicts)
		}
		got, detail := sailplaneVerdict(v.path, doc)
		switch {
		case (got == "error") != (v.verdict == "error"):
			t.Errorf("%s document %s: Istio says %s, Sailplane says %s\n  Istio: %s\n  Sailplane: %s", v.path, name, v.verdict, got, v.message, detail)
		case v.verdict == "warning" && got != "warning":
			t.Errorf("%s document %s: Istio warns, Sailplane does not\n  Istio: %s", v.path, name, v.message)
		case got != v.verdict:
			// Sailplane warns where Istio does not (a name the API server would refuse): allowed.
			warnMismatch++
			t.Logf("%s document %s: Istio says %s, Sailplane says %s: %s", v.path, name, v.verdict, got, detail)
		default:
			agree++
		}
	}
	t.Logf("%d of %d documents agree exactly with Istio; %d more differ only by a Sailplane warning", agree, len(verdicts), warnMismatch)
}

// sailplaneVerdict parses and validates one document as config-ingest does.
func sailplaneVerdict(path string, doc []byte) (verdict, detail string) {
	cfgs, errs := ParseYAML(path, doc, "default")
	var warnings []string
	for _, c := range cfgs {
		ws, err := Validate(c)
		if err != nil {
			errs = append(errs, err)
		}
		for _, w := range ws {
			warnings = append(warnings, w.String())
		}
	}
	switch {
	case len(errs) > 0:
		var msgs []string
		for _, err := range errs {
			msgs = append(msgs, err.Error())
		}
		return "error", strings.Join(msgs, "; ")
	case len(warnings) > 0:
		return "warning", strings.Join(warnings, "; ")
	}
	return "valid", ""
}

func readVerdicts(t *testing.T) (module string, verdicts []recordedVerdict) {
	t.Helper()
	f, err := os.Open(istioVerdicts)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if m, ok := strings.CutPrefix(line, "module "); ok {
			module = m
			continue
		}
		fields := strings.SplitN(line, " ", 5)
		if len(fields) < 4 {
			t.Fatalf("%s: malformed line %q", istioVerdicts, line)
		}
		index, withoutErr := strings.CutSuffix(fields[1], "-_err")
		doc, err := strconv.Atoi(index)
		if err != nil {
			t.Fatalf("%s: malformed line %q", istioVerdicts, line)
		}
		v := recordedVerdict{path: fields[0], doc: doc, withoutErr: withoutErr, sum: fields[2], verdict: fields[3]}
		if len(fields) == 5 {
			v.message = fields[4]
		}
		verdicts = append(verdicts, v)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if module == "" || len(verdicts) == 0 {
		t.Fatalf("%s names no module or no documents", istioVerdicts)
	}
	return module, verdicts
}

// downloadModule returns the directory of module (path@version) in the module cache, downloading
// it if needed.
func downloadModule(t *testing.T, module string) string {
	t.Helper()
	out, err := exec.Command("go", "mod", "download", "-json", module).Output()
	var m struct{ Dir, Error string }
	if jerr := json.Unmarshal(out, &m); err != nil || jerr != nil || m.Dir == "" {
		t.Fatalf("go mod download %s: %v %v %s", module, err, jerr, m.Error)
	}
	return m.Dir
}
