package ca

import (
	"crypto/x509"
	"slices"
	"testing"
)

// A listen host given as an IP must become an IP SAN, or clients dialing it cannot verify.
func TestServingNamesSplitsIPs(t *testing.T) {
	dns, ips := servingNames([]string{"istiod.istio-system.svc", "198.18.0.1", "127.0.0.1", "localhost"})
	if !slices.Equal(dns, []string{"istiod.istio-system.svc", "localhost"}) {
		t.Errorf("DNS names %v", dns)
	}
	var got []string
	for _, ip := range ips {
		got = append(got, ip.String())
	}
	if !slices.Equal(got, []string{"127.0.0.1", "::1", "198.18.0.1"}) {
		t.Errorf("IP addresses %v", got)
	}
}

// ServingCertificate signs, in-process, a certificate for the names asked (hyper's webhook),
// verified by the ca's roots, and keeps it until half its life.
func TestServingCertificate(t *testing.T) {
	r := startCA(t, Config{CertDir: t.TempDir()})
	get := r.ServingCertificate([]string{"sailplane-webhook.istio-system.svc"})
	c, err := get(nil)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(c.Leaf.DNSNames, []string{"sailplane-webhook.istio-system.svc"}) {
		t.Errorf("DNS names %v", c.Leaf.DNSNames)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(r.RootsPEM())
	if _, err := c.Leaf.Verify(x509.VerifyOptions{Roots: roots, DNSName: "sailplane-webhook.istio-system.svc"}); err != nil {
		t.Errorf("verify against the ca's roots: %v", err)
	}
	if again, _ := get(nil); again != c {
		t.Error("a second handshake got a new certificate; want the same until half its life")
	}
}
