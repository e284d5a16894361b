package webhook

import (
	"crypto/x509"
	"testing"
)

// A self-managed certificate names the webhook's Service (and the listen address), chains to the
// roots it reports (its renewal is pki.ServingCert's, TestServingCertRenewal).
func TestSelfManaged(t *testing.T) {
	cert, err := SelfManaged(append(DNSNames("istio-system"), "10.0.0.7", "0.0.0.0", ""))
	if err != nil {
		t.Fatal(err)
	}
	c, err := cert.Get(nil)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(cert.Roots())
	for _, name := range []string{"sailplane-webhook.istio-system.svc", "sailplane-webhook.istio-system.svc.cluster.local", "10.0.0.7", "127.0.0.1", "::1"} {
		if _, err := c.Leaf.Verify(x509.VerifyOptions{Roots: roots, DNSName: name}); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	if len(c.Leaf.IPAddresses) != 3 {
		t.Errorf("IP addresses %v: want 127.0.0.1, ::1 and 10.0.0.7 (not the unspecified address)", c.Leaf.IPAddresses)
	}

}
