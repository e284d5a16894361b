package webhook

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"testing"
	"time"

	"sailplane.dev/shared/pki"
)

// A self-managed certificate names the webhook's Service (and the listen address), chains to the
// roots it reports, and is renewed once half its life has passed.
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

	// Renewal, with a lifetime short enough to see it: the certificate is valid from
	// pki.ClockSkew ago, so half its life is over TTL/2 - ClockSkew/2 from now, 5 s here.
	auth, err := pki.NewSelfSigned(pki.ECDSAP256, "test", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	sm := &selfManaged{auth: auth, opts: pki.LeafOptions{IPs: []net.IP{net.IPv4(127, 0, 0, 1)}, TTL: pki.ClockSkew + 10*time.Second}}
	first, err := sm.get(nil)
	if err != nil {
		t.Fatal(err)
	}
	if again, _ := sm.get(nil); again != first {
		t.Fatal("renewed before half its life")
	}
	deadline := time.Now().Add(time.Minute)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	var next *tls.Certificate
	for next = first; next == first && time.Now().Before(deadline); next, _ = sm.get(nil) {
		<-tick.C
	}
	if next == first || !next.Leaf.NotAfter.After(first.Leaf.NotAfter) {
		t.Errorf("not renewed: %v, then %v", first.Leaf.NotAfter, next.Leaf.NotAfter)
	}
}
