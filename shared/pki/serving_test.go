package pki

import (
	"crypto/tls"
	"net"
	"testing"
	"time"
)

// A serving certificate is renewed once half its life has passed, not before.
func TestServingCertRenewal(t *testing.T) {
	// With a lifetime short enough to see it: the certificate is valid from
	// ClockSkew ago, so half its life is over TTL/2 - ClockSkew/2 from now, 5 s here.
	auth, err := NewSelfSigned(ECDSAP256, "test", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	sm := &ServingCert{auth: auth, alg: ECDSAP256, opts: LeafOptions{IPs: []net.IP{net.IPv4(127, 0, 0, 1)}, TTL: ClockSkew + 10*time.Second}}
	first, err := sm.GetCertificate(nil)
	if err != nil {
		t.Fatal(err)
	}
	if again, _ := sm.GetCertificate(nil); again != first {
		t.Fatal("renewed before half its life")
	}
	deadline := time.Now().Add(time.Minute)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	var next *tls.Certificate
	for next = first; next == first && time.Now().Before(deadline); next, _ = sm.GetCertificate(nil) {
		<-tick.C
	}
	if next == first || !next.Leaf.NotAfter.After(first.Leaf.NotAfter) {
		t.Errorf("not renewed: %v, then %v", first.Leaf.NotAfter, next.Leaf.NotAfter)
	}
}
