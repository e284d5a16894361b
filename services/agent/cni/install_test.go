package cni

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"log/slog"
	"math/big"
	"os"
	"path/filepath"
	"testing"
	"time"

	"sailplane.dev/shared/testlog"
)

// TestInstall: the installer copies the binary, writes the token and a kubeconfig the plugin
// reads, appends the plugin to the primary network configuration list (a single-plugin .conf
// becomes a list), keeps the primary CNI's plugins first and unchanged, and a second pass
// changes nothing; a primary CNI rewriting its file gets the plugin appended again.
func TestInstall(t *testing.T) {
	for _, tc := range []struct {
		name, file, primary string
		wantFile            string
	}{
		{"conflist", "10-calico.conflist", `{"cniVersion":"1.0.0","name":"k8s-pod-network","plugins":[{"type":"calico","ipam":{"type":"calico-ipam"}},{"type":"portmap","capabilities":{"portMappings":true}}]}`, "10-calico.conflist"},
		{"conf", "10-bridge.conf", `{"cniVersion":"0.4.0","name":"bridge","type":"bridge","bridge":"cni0","ipam":{"type":"host-local"}}`, "10-bridge.conflist"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			bin, conf, sa := filepath.Join(root, "bin"), filepath.Join(root, "net.d"), filepath.Join(root, "sa")
			for _, d := range []string{bin, conf, sa} {
				if err := os.Mkdir(d, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			write := func(path, data string) {
				t.Helper()
				if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			write(filepath.Join(conf, tc.file), tc.primary)
			write(filepath.Join(conf, "99-other.conflist"), `{"cniVersion":"1.0.0","name":"other","plugins":[{"type":"x"}]}`)
			write(filepath.Join(sa, "token"), "tok")
			write(filepath.Join(sa, "ca.crt"), selfSignedPEM(t))
			write(filepath.Join(root, "plugin"), "binary")
			in := &Installer{
				Binary: filepath.Join(root, "plugin"), BinDir: bin, ConfDir: conf, HostConfDir: "/etc/cni/net.d",
				Server: "https://10.96.0.1:443", TokenFile: filepath.Join(sa, "token"), CAFile: filepath.Join(sa, "ca.crt"),
				ExcludeNamespaces: []string{"kube-system"}, Log: testlog.New(t, slog.LevelInfo),
			}
			changed, err := in.Once()
			if err != nil || !changed {
				t.Fatalf("first install: changed %v, %v", changed, err)
			}
			if b, err := os.ReadFile(filepath.Join(bin, PluginType)); err != nil || string(b) != "binary" {
				t.Errorf("the binary in the bin folder: %q, %v", b, err)
			}
			var list struct {
				CNIVersion, Name string
				Plugins          []map[string]any
			}
			data, err := os.ReadFile(filepath.Join(conf, tc.wantFile))
			if err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal(data, &list); err != nil {
				t.Fatal(err)
			}
			last := list.Plugins[len(list.Plugins)-1]
			if list.CNIVersion == "" || list.Name == "" || last["type"] != PluginType || last["kubeconfig"] != "/etc/cni/net.d/"+kubeconfigName {
				t.Errorf("the list: %s", data)
			}
			if first := list.Plugins[0]; first["type"] != "calico" && first["type"] != "bridge" || first["cniVersion"] != nil {
				t.Errorf("the primary plugin is not first and unchanged: %s", data)
			}
			if tc.file != tc.wantFile {
				if _, err := os.Stat(filepath.Join(conf, tc.file)); !os.IsNotExist(err) {
					t.Errorf("the .conf is still there beside the list: %v", err)
				}
			}
			if _, err := newKubeClient(filepath.Join(conf, kubeconfigName)); err != nil {
				t.Errorf("the plugin cannot read the kubeconfig written: %v", err)
			}
			if changed, err := in.Once(); err != nil || changed {
				t.Errorf("second pass: changed %v, %v; want nothing changed", changed, err)
			}
			// The primary CNI rewrites its file: the plugin is appended again.
			write(filepath.Join(conf, tc.wantFile), `{"cniVersion":"1.0.0","name":"k8s-pod-network","plugins":[{"type":"calico"}]}`)
			if changed, err := in.Once(); err != nil || !changed {
				t.Errorf("after the primary's rewrite: changed %v, %v", changed, err)
			}
			data, _ = os.ReadFile(filepath.Join(conf, tc.wantFile))
			_ = json.Unmarshal(data, &list)
			if len(list.Plugins) != 2 || list.Plugins[1]["type"] != PluginType {
				t.Errorf("after the primary's rewrite: %s", data)
			}
		})
	}
}

func selfSignedPEM(t *testing.T) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "ca"}, NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
}
