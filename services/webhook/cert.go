package webhook

import (
	"crypto/tls"
	"net"
	"slices"
	"time"

	"sailplane.dev/shared/pki"
	"sailplane.dev/shared/workloadcert"
)

// Certificate is the webhook's serving certificate and the roots that verify it (what the
// configurations' caBundle must hold).
type Certificate struct {
	// Get is the tls.Config.GetCertificate of the listener.
	Get func(*tls.ClientHelloInfo) (*tls.Certificate, error)
	// Roots are the PEM roots verifying Get's certificates; nil before there is one.
	Roots func() []byte
	// Ready is closed once Get has a certificate; nil: at once.
	Ready <-chan struct{}
}

// WorkloadCertificate serves the certificate a workloadcert client holds: the webhook's own,
// from the ca, which adds the webhook Service's names to the webhook service account's
// certificates (ca --webhook-account). The client must run.
func WorkloadCertificate(client *workloadcert.Client) *Certificate {
	return &Certificate{
		Get: workloadcert.GetCertificate(client),
		Roots: func() []byte {
			if c := client.Current(); c != nil {
				return c.RootsPEM
			}
			return nil
		},
		Ready: client.Ready(),
	}
}

// Lifetimes of a self-managed certificate: the root lives as long as the process (it is never
// written anywhere), the serving certificate is renewed at half its life.
const (
	selfManagedRootTTL = 10 * 365 * 24 * time.Hour
	selfManagedLeafTTL = 24 * time.Hour
)

// SelfManaged is a serving certificate for names (DNS names or IP addresses; 127.0.0.1 and ::1
// are always in) signed by a root generated in memory, for a webhook whose ca is elsewhere. The
// root changes at each start, so the caBundle is patched again: run one replica.
func SelfManaged(names []string) (*Certificate, error) {
	auth, err := pki.NewSelfSigned(pki.ECDSAP256, "Sailplane webhook", selfManagedRootTTL)
	if err != nil {
		return nil, err
	}
	opts := pki.LeafOptions{IPs: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}, TTL: selfManagedLeafTTL}
	for _, n := range names {
		switch ip := net.ParseIP(n); {
		case n == "":
		case ip == nil:
			opts.DNSNames = append(opts.DNSNames, n)
		case !ip.IsUnspecified() && !slices.ContainsFunc(opts.IPs, ip.Equal):
			opts.IPs = append(opts.IPs, ip)
		}
	}
	sc, err := pki.NewServingCert(auth, pki.ECDSAP256, opts)
	if err != nil {
		return nil, err
	}
	roots := pki.EncodeCerts(auth.Roots...)
	ready := make(chan struct{})
	close(ready)
	return &Certificate{Get: sc.GetCertificate, Roots: func() []byte { return roots }, Ready: ready}, nil
}
