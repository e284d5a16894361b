package upstream

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"slices"
	"time"

	"google.golang.org/grpc/credentials"

	"sailplane.dev/shared/mesh"
	"sailplane.dev/shared/spiffe"
	"sailplane.dev/shared/workloadcert"
)

// ErrServerIdentity is an upstream's certificate that is not the one expected.
var ErrServerIdentity = errors.New("upstream server identity not accepted")

// mutualTLS is ISTIO_MUTUAL to src: the service's workload certificate is presented (istiod on
// 15012 authenticates it, and its api generator wants a control-plane identity), and the
// server's certificate must chain to the mesh's trust bundle and name either one of
// tlsSettings.subjectAltNames or, without them, the host dialled (tlsSettings.sni, else the
// address's host: istiod's certificate names istiod.istio-system.svc) or a SPIFFE identity of
// the control plane's namespace (another Sailplane's config-ingest).
func mutualTLS(id workloadcert.Source, src mesh.XDSSource, namespace string) credentials.TransportCredentials {
	host, _, _ := net.SplitHostPort(src.Target)
	serverName := host
	if sni := src.TLS.GetSni(); sni != "" {
		serverName = sni
	}
	sans := src.TLS.GetSubjectAltNames()
	return credentials.NewTLS(&tls.Config{
		MinVersion: tls.VersionTLS12,
		ServerName: serverName,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			c := id.Current()
			if c == nil {
				return nil, workloadcert.ErrNoCredential
			}
			t := c.TLSCertificate()
			return &t, nil
		},
		// Replaced by VerifyPeerCertificate: the chain to the mesh's roots, then the name.
		InsecureSkipVerify: true,
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			leaf, trustDomain, err := verifyChain(id, raw)
			if err != nil {
				return err
			}
			return acceptServer(leaf, serverName, sans, trustDomain, namespace)
		},
	})
}

// verifyChain checks the server's chain against the bundle of the current credential.
func verifyChain(id workloadcert.Source, raw [][]byte) (*x509.Certificate, string, error) {
	c := id.Current()
	if c == nil {
		return nil, "", workloadcert.ErrNoCredential
	}
	if len(raw) == 0 {
		return nil, "", errors.New("no server certificate")
	}
	certs := make([]*x509.Certificate, len(raw))
	for i, r := range raw {
		x, err := x509.ParseCertificate(r)
		if err != nil {
			return nil, "", fmt.Errorf("server certificate %d: %w", i, err)
		}
		certs[i] = x
	}
	roots, inter := x509.NewCertPool(), x509.NewCertPool()
	for _, r := range c.Roots {
		roots.AddCert(r)
	}
	for _, x := range certs[1:] {
		inter.AddCert(x)
	}
	if _, err := certs[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, CurrentTime: time.Now(),
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageAny}}); err != nil {
		return nil, "", fmt.Errorf("server certificate does not chain to the mesh's trust bundle: %w", err)
	}
	return certs[0], c.ID.TrustDomain, nil
}

func acceptServer(leaf *x509.Certificate, serverName string, sans []string, trustDomain, namespace string) error {
	var names []string
	names = append(names, leaf.DNSNames...)
	for _, u := range leaf.URIs {
		names = append(names, u.String())
	}
	if len(sans) > 0 {
		for _, n := range names {
			if slices.Contains(sans, n) {
				return nil
			}
		}
		return fmt.Errorf("%w: it names %v, tlsSettings.subjectAltNames %v", ErrServerIdentity, names, sans)
	}
	if leaf.VerifyHostname(serverName) == nil {
		return nil
	}
	for _, u := range leaf.URIs {
		if id, err := spiffe.FromURL(u); err == nil && id.TrustDomain == trustDomain && id.Namespace == namespace {
			return nil
		}
	}
	return fmt.Errorf("%w: it names %v, neither %s nor an identity of namespace %s (set tlsSettings.sni or subjectAltNames)",
		ErrServerIdentity, names, serverName, namespace)
}
