package ca

import (
	"fmt"

	securityv1 "sailplane.dev/proto/security/v1"
	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/pki"
	"sailplane.dev/shared/schema"
)

// PublishedTypes are the bus types the ca publishes: its trust bundle.
func PublishedTypes() []string { return []string{schema.TrustBundle.TypeURL} }

// trustBundle is every root the ca trusts, the one it signs under first, as published on the bus.
func trustBundle(trustDomain string, auth *pki.Authority) *securityv1.TrustBundle {
	b := &securityv1.TrustBundle{TrustDomain: trustDomain}
	for _, r := range auth.Roots {
		b.RootCertificates = append(b.RootCertificates, string(pki.EncodeCerts(r)))
	}
	return b
}

// publishBundle replaces the TrustBundle state with this ca's bundle, named after its trust
// domain.
func (s *Service) publishBundle(pub bus.Publisher, auth *pki.Authority) error {
	r := &bus.Resource{Name: s.cfg.TrustDomain, Body: trustBundle(s.cfg.TrustDomain, auth)}
	if err := pub.Replace(schema.TrustBundle.TypeURL, []*bus.Resource{r}); err != nil {
		return fmt.Errorf("ca: publish the trust bundle: %w", err)
	}
	return nil
}
