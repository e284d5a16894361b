package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sailplane.dev/shared/config/analyze"
)

// runIn runs sailplanectl with stdin.
func runIn(t *testing.T, stdin string, args ...string) (string, error) {
	t.Helper()
	cmd := rootCmd()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetIn(strings.NewReader(stdin))
	cmd.SetArgs(args)
	err := cmd.Execute()
	return out.String(), err
}

func TestValidate(t *testing.T) {
	invalid, err := os.ReadFile("testdata/conf/nested/invalid.yml")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		stdin string
		args  []string
		// wantFound: the command fails with errFound (exit code 1, for CI).
		wantFound bool
		want      []string
		dontWant  []string
	}{
		{
			name: "valid file", args: []string{"-f", "testdata/conf/valid.yaml"},
			want: []string{"No problems found in 1 file.\n"},
		},
		{
			name: "folder, recursively", args: []string{"-f", "testdata/conf"}, wantFound: true,
			want: []string{
				"VirtualService demo/split  testdata/conf/nested/invalid.yml document 2  spec.http[0].route[0].weight  must not be negative, got -10",
				"VirtualService demo/split  testdata/conf/nested/invalid.yml document 2  spec.http[0].route[1].weight  must not be negative, got -110",
				"DestinationRule demo/typo  testdata/conf/nested/invalid.yml document 3  spec.hots",
				`unknown field "hots"`,
			},
			// The good resources (and the JSON file, read as such) and files of other kinds say nothing.
			dontWant: []string{"demo/good", "gateway.json", "README"},
		},
		{
			name: "stdin", stdin: string(invalid), args: []string{"-f", "-"}, wantFound: true,
			want: []string{"VirtualService demo/split  - document 2  spec.http[0].route[0].weight"},
		},
		{
			name: "warnings only", args: []string{"-f", "testdata/warning.yaml"},
			want: []string{"Warning  IST0158  VirtualService demo/Upper_Case  testdata/warning.yaml document 1  metadata.name"},
		},
		{
			name: "warnings as errors", args: []string{"-f", "testdata/warning.yaml", "--warnings-as-errors"}, wantFound: true,
			want: []string{"Warning"},
		},
		{
			name: "manifests", args: []string{"-f", "testdata/manifests.yaml"}, wantFound: true,
			want:     []string{`EnvoyFilter demo/lua  testdata/manifests.yaml document 3         unknown kind networking.istio.io/v1alpha3 "EnvoyFilter"`},
			dontWant: []string{"Deployment", "Service "},
		},
		{
			name: "missing file", args: []string{"-f", "testdata/conf/valid.yaml", "-f", "testdata/missing.yaml"}, wantFound: true,
			want: []string{"testdata/missing.yaml", "cannot be read"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := runIn(t, tc.stdin, append([]string{"validate"}, tc.args...)...)
			if found := errors.Is(err, errFound); found != tc.wantFound || err != nil && !found {
				t.Errorf("err = %v, want errFound: %v", err, tc.wantFound)
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
			for _, w := range tc.dontWant {
				if strings.Contains(out, w) {
					t.Errorf("output has %q:\n%s", w, out)
				}
			}
		})
	}
}

func TestValidateJSON(t *testing.T) {
	out, err := run(t, "validate", "-f", "testdata/conf/nested/invalid.yml", "-o", "json")
	if !errors.Is(err, errFound) {
		t.Errorf("err = %v, want errFound", err)
	}
	var msgs []analyze.Message
	if err := json.Unmarshal([]byte(out), &msgs); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out)
	}
	want := analyze.Message{
		Level: analyze.Error, Code: analyze.CodeSchemaValidationError, Kind: "VirtualService", Namespace: "demo", Name: "split",
		File: "testdata/conf/nested/invalid.yml", Doc: 2, Field: "spec.http[0].route[0].weight", Message: "must not be negative, got -10",
	}
	if len(msgs) != 3 || msgs[0] != want {
		t.Errorf("messages = %+v, want 3 starting with %+v", msgs, want)
	}
}

func TestValidateNoInput(t *testing.T) {
	if _, err := run(t, "validate"); err == nil || errors.Is(err, errFound) {
		t.Errorf("err = %v, want a usage error", err)
	}
}

// TestValidateConfigMapVolume: a ConfigMap volume's layout (files linked through ..data to a
// hidden timestamped folder), reached through a symlinked folder, is read once per file.
func TestValidateConfigMapVolume(t *testing.T) {
	dir := t.TempDir()
	vol := filepath.Join(dir, "vol")
	data, err := os.ReadFile("testdata/conf/valid.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, step := range []error{
		os.MkdirAll(filepath.Join(vol, "..2026_11_25"), 0o755),
		os.WriteFile(filepath.Join(vol, "..2026_11_25", "echo.yaml"), data, 0o644),
		os.Symlink("..2026_11_25", filepath.Join(vol, "..data")),
		os.Symlink(filepath.Join("..data", "echo.yaml"), filepath.Join(vol, "echo.yaml")),
		os.Symlink(vol, filepath.Join(dir, "link")),
	} {
		if step != nil {
			t.Fatal(step)
		}
	}
	out, err := run(t, "validate", "-f", filepath.Join(dir, "link"))
	if err != nil || out != "No problems found in 1 file.\n" {
		t.Errorf("validate = %q, %v", out, err)
	}
}
