package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestCorpus(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) {
		t.Helper()
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("samples/a.yaml", `# comment only
---
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: gw}
---
apiVersion: v1
kind: Service
metadata: {name: svc}
---
apiVersion: telemetry.istio.io/v1
kind: Telemetry
metadata: {name: t}
---
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: {{ .Name }}}
---
apiVersion: "security.istio.io/v1beta1"
kind: AuthorizationPolicy
metadata: {name: ap}
_err: expected
`)
	write("testdata/b.yml", "apiVersion: networking.istio.io/v1alpha3\nkind: VirtualService\nmetadata: {name: vs}\n")
	write("testdata/c.json", "apiVersion: networking.istio.io/v1alpha3\nkind: VirtualService\n")

	docs, err := corpus(dir)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, d := range docs {
		got = append(got, d.Path+" "+d.Doc)
	}
	want := []string{"samples/a.yaml 1", "samples/a.yaml 5", "samples/a.yaml 5-_err", "testdata/b.yml 1"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("corpus = %q, want %q", got, want)
	}
	if strings.Contains(string(docs[2].Text), "_err") || !strings.Contains(string(docs[1].Text), "_err") {
		t.Errorf("the -_err variant must be the document without its _err line: %q / %q", docs[1].Text, docs[2].Text)
	}
}

func TestOneLine(t *testing.T) {
	in := "Error: 1 error occurred:\n\t* Gateway//x: port name must be set\n\n\n"
	if got := oneLine(in); got != "Gateway//x: port name must be set" {
		t.Errorf("oneLine = %q", got)
	}
	if got := oneLine(strings.Repeat("é", maxMessage+10)); len([]rune(got)) != maxMessage+1 {
		t.Errorf("not cut at %d runes: %d", maxMessage, len([]rune(got)))
	}
}
