package workloadcert

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"

	"sailplane.dev/shared/spiffe"
)

// ErrNoCredential is a handshake before the first certificate arrived: the peer retries.
var ErrNoCredential = errors.New("no certificate yet")

// ServerTLS is the TLS config of an mTLS listener for src's workload: it presents src's current
// certificate (so a renewal is used from the next handshake on, and open connections are kept),
// and requires a client certificate that chains to the trust bundle of src's current credential.
// Which identities may call is decided after the handshake (Authorize), so a refusal is a clean
// PermissionDenied naming the caller rather than a failed handshake.
func ServerTLS(src Source) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return certificate(src)
		},
		ClientAuth: tls.RequireAnyClientCert,
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			_, err := verifyPeer(src, raw)
			return err
		},
		NextProtos: []string{"h2"},
	}
}

// ClientTLS is the TLS config of a connection from src's workload: it presents src's current
// certificate and accepts a server whose certificate chains to src's trust bundle and whose
// SPIFFE ID authorize accepts. (SPIFFE certificates name no host, so the host name check is
// replaced by the identity check.)
func ClientTLS(src Source, authorize func(spiffe.ID) error) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return certificate(src)
		},
		InsecureSkipVerify: true, // replaced by VerifyPeerCertificate: chain and SPIFFE ID
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			id, err := verifyPeer(src, raw)
			if err != nil {
				return err
			}
			if err := authorize(id); err != nil {
				return fmt.Errorf("server %s: %w", id, err)
			}
			return nil
		},
	}
}

// GetCertificate is a tls.Config.GetCertificate presenting src's current certificate, for a
// server that authenticates no client itself (xds-server's TLS xDS).
func GetCertificate(src Source) func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return certificate(src) }
}

func certificate(src Source) (*tls.Certificate, error) {
	c := src.Current()
	if c == nil {
		return nil, ErrNoCredential
	}
	t := c.TLSCertificate()
	return &t, nil
}

// verifyPeer checks a peer's chain against the bundle of src's current credential and returns
// its SPIFFE ID.
func verifyPeer(src Source, raw [][]byte) (spiffe.ID, error) {
	c := src.Current()
	if c == nil {
		return spiffe.ID{}, ErrNoCredential
	}
	if len(raw) == 0 {
		return spiffe.ID{}, errors.New("no peer certificate")
	}
	certs := make([]*x509.Certificate, len(raw))
	for i, r := range raw {
		x, err := x509.ParseCertificate(r)
		if err != nil {
			return spiffe.ID{}, fmt.Errorf("peer certificate %d: %w", i, err)
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
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		return spiffe.ID{}, err
	}
	return identityOf(certs[0])
}

func identityOf(leaf *x509.Certificate) (spiffe.ID, error) {
	if len(leaf.URIs) != 1 {
		return spiffe.ID{}, fmt.Errorf("peer certificate has %d URI SANs, want one SPIFFE ID", len(leaf.URIs))
	}
	return spiffe.FromURL(leaf.URIs[0])
}

// PeerID is the SPIFFE ID of an mTLS gRPC call's peer (verified during the handshake).
func PeerID(ctx context.Context) (spiffe.ID, error) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return spiffe.ID{}, errors.New("no peer")
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.PeerCertificates) == 0 {
		return spiffe.ID{}, fmt.Errorf("peer %s: no client certificate", p.Addr)
	}
	return identityOf(info.State.PeerCertificates[0])
}
