package ca

import (
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
