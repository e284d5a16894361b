package xdsserver

import (
	"crypto/tls"
	"os"
	"path/filepath"
	"testing"
	"time"

	"sailplane.dev/shared/pki"
)

// TestFolderTLS: the listener's certificate is read from the folder, re-read when renewed, and a
// mismatched pair (a renewal half written) keeps the previous one; an empty folder fails.
func TestFolderTLS(t *testing.T) {
	auth, err := pki.NewSelfSigned(pki.ECDSAP256, "cluster.local", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	issue := func() (certPEM, keyPEM []byte, serial string) {
		key, err := pki.GenerateKey(pki.ECDSAP256)
		if err != nil {
			t.Fatal(err)
		}
		leaf, err := auth.Issue(key.Public(), pki.LeafOptions{DNSNames: []string{"xds-server"}, TTL: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		keyPEM, err = pki.EncodeKey(key)
		if err != nil {
			t.Fatal(err)
		}
		return pki.EncodeCerts(leaf), keyPEM, leaf.SerialNumber.String()
	}
	dir := t.TempDir()
	write := func(name string, data []byte, mtime time.Time) {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		// Distinct modification times, as successive renewals have.
		if err := os.Chtimes(p, mtime, mtime); err != nil {
			t.Fatal(err)
		}
	}
	get := FolderTLS(dir).GetCertificate
	served := func() string {
		t.Helper()
		c, err := get(&tls.ClientHelloInfo{})
		if err != nil {
			t.Fatal(err)
		}
		return c.Leaf.SerialNumber.String()
	}

	if _, err := get(&tls.ClientHelloInfo{}); err == nil {
		t.Fatal("an empty folder served a certificate")
	}
	t0 := time.Now().Add(-time.Hour)
	cert1, key1, serial1 := issue()
	write(servingCertFile, cert1, t0)
	write(servingKeyFile, key1, t0)
	if got := served(); got != serial1 {
		t.Fatalf("served %s, want %s", got, serial1)
	}
	cert2, key2, serial2 := issue()
	write(servingKeyFile, key2, t0.Add(time.Minute)) // the key first: a mismatched pair
	if got := served(); got != serial1 {
		t.Fatalf("mid-renewal served %s, want the previous %s", got, serial1)
	}
	write(servingCertFile, cert2, t0.Add(time.Minute))
	if got := served(); got != serial2 {
		t.Fatalf("after renewal served %s, want %s", got, serial2)
	}
}
