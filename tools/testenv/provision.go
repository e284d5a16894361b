package testenv

import (
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"sailplane.dev/shared/pki"
	"sailplane.dev/shared/spiffe"
)

// ProvisionCert issues a certificate for id, valid for an hour, with the CA kept in caCertDir
// (Istio's layout, as the ca writes it), and writes it as cert-chain.pem and key.pem into a new
// folder it returns: what an operator gives a VM so its agent can authenticate without a token.
func ProvisionCert(t testing.TB, caCertDir string, id spiffe.ID) string {
	t.Helper()
	auth := CAFromFolder(t, caCertDir)
	key, err := pki.GenerateKey(pki.ECDSAP256)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := auth.Issue(key.Public(), pki.LeafOptions{URIs: []*url.URL{id.URL()}, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, err := pki.EncodeKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for name, data := range map[string][]byte{"cert-chain.pem": pki.EncodeCerts(leaf), "key.pem": keyPEM} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// CAFromFolder reads the CA the ca keeps in caCertDir (Istio's layout), for tests that issue
// certificates out of band.
func CAFromFolder(t testing.TB, caCertDir string) *pki.Authority {
	t.Helper()
	files := map[string][]byte{}
	for _, name := range []string{pki.CACertFile, pki.CAKeyFile, pki.RootCertFile, pki.CertChainFile} {
		if data, err := os.ReadFile(filepath.Join(caCertDir, name)); err == nil {
			files[name] = data
		}
	}
	auth, err := pki.FromIstioLayout(files)
	if err != nil {
		t.Fatalf("CA in %s: %v", caCertDir, err)
	}
	return auth
}
