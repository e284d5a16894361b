package grpcbootstrap

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestNew(t *testing.T) {
	files := &Files{CertChain: "/c/cert-chain.pem", Key: "/c/key.pem", Roots: "/c/root-cert.pem", RefreshInterval: "900s"}
	for _, tc := range []struct {
		name      string
		w         Workload
		wantCreds string // the channel's credentials type
		wantErr   string
	}{
		{"plaintext, no certificates", Workload{XDSAddress: "x:15010", Namespace: "demo"}, "insecure", ""},
		{"plaintext with certificates", Workload{XDSAddress: "x:15010", Namespace: "demo", Credentials: files}, "insecure", ""},
		{"mTLS", Workload{XDSAddress: "x:15012", Namespace: "demo", Credentials: files, XDSOverTLS: true}, "tls", ""},
		{"mTLS without files", Workload{XDSAddress: "x:15012", XDSOverTLS: true}, "", "credential files"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := New(tc.w)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := b.XDSServers[0].ChannelCreds[0].Type; got != tc.wantCreds {
				t.Errorf("channel_creds %q, want %q", got, tc.wantCreds)
			}
			if p, ok := b.CertificateProviders[DefaultProvider]; ok != (tc.w.Credentials != nil) || ok && p.PluginName != "file_watcher" {
				t.Errorf("certificate_providers = %+v", b.CertificateProviders)
			}
			if b.Node.Metadata["GENERATOR"] != "grpc" || b.Node.Locality == nil {
				t.Errorf("node = %+v", b.Node)
			}
		})
	}
}

func TestWriteFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "bootstrap.json")
	b, err := New(Workload{XDSAddress: "x:15010", Namespace: "demo", Labels: map[string]string{"app": "web"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.WriteFile(path); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var back map[string]any
	if err := json.Unmarshal(data, &back); err != nil {
		t.Fatalf("written bootstrap: %v", err)
	}
	if entries, _ := os.ReadDir(filepath.Dir(path)); len(entries) != 1 {
		t.Errorf("%d files in the folder, want only the bootstrap (no temporary left)", len(entries))
	}
}
