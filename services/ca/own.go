package ca

import (
	"context"
	"crypto/x509"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"time"

	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/pki"
	"sailplane.dev/shared/spiffe"
	"sailplane.dev/shared/workloadcert"
)

// ownCertTTL is the lifetime of the certificates the ca signs for the control plane itself
// (renewed at half of it, so a folder copy is always valid for another half), unless
// MaxCertTTL is shorter.
const ownCertTTL = 24 * time.Hour

// ownCredential is a certificate the ca signs for one of the control plane's identities without
// a CSR round trip: the ca's own on its bus, hyper's, and the folders of --service-cert-dir. A
// fresh key is generated for each; it is renewed at half its lifetime or when another root signs.
type ownCredential struct {
	s  *Service
	id spiffe.ID

	mu   sync.Mutex
	auth *pki.Authority // the authority that signed cur
	cur  *workloadcert.Credential
}

// Own is a credential source for id, signed by this ca in-process (nil until Run loaded the
// root). It is for the control plane's own identities: the ca's and hyper's bus listener.
func (s *Service) Own(id spiffe.ID) workloadcert.Source { return &ownCredential{s: s, id: id} }

// UseMesh sets Deps.Mesh after New, for a mesh source that needs the ca's own identity (the
// config bus over mTLS with Own's certificate). Call it before Run.
func (s *Service) UseMesh(src bus.Source) { s.mesh = src }

// ServiceAccount is the ca's service account (deploy/), its identity on its bus.
const ServiceAccount = "ca"

func (o *ownCredential) Current() *workloadcert.Credential {
	auth := o.s.authority()
	if auth == nil {
		return nil
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if c := o.cur; c != nil && o.auth == auth && time.Now().Before(halfLife(c.Leaf().NotBefore, c.Leaf().NotAfter)) {
		return c
	}
	c, err := o.sign(auth)
	if err != nil {
		o.s.log.Error("cannot sign the control plane's own certificate", "identity", o.id.String(), "error", err)
		return o.cur // the previous one, if any, until it can be renewed
	}
	o.auth, o.cur = auth, c
	return c
}

func (o *ownCredential) sign(auth *pki.Authority) (*workloadcert.Credential, error) {
	key, err := pki.GenerateKey(o.s.cfg.KeyAlgorithm)
	if err != nil {
		return nil, err
	}
	leaf, err := auth.Issue(key.Public(), pki.LeafOptions{URIs: []*url.URL{o.id.URL()}, TTL: min(ownCertTTL, o.s.cfg.MaxCertTTL)})
	if err != nil {
		return nil, err
	}
	keyPEM, err := pki.EncodeKey(key)
	if err != nil {
		return nil, err
	}
	chain := append([]*x509.Certificate{leaf}, auth.Chain()...)
	return &workloadcert.Credential{
		ID: o.id, Key: key, Chain: chain, Roots: auth.Roots,
		KeyPEM: keyPEM, ChainPEM: pki.EncodeCerts(chain...), RootsPEM: pki.EncodeCerts(auth.Roots...),
		Received: time.Now(),
	}, nil
}

func halfLife(from, to time.Time) time.Time { return from.Add(to.Sub(from) / 2) }

// ServiceAccounts are the control plane services that get a folder in ServiceCertDir.
var ServiceAccounts = []string{"config-ingest", "endpoint-watcher", "xds-server", "webhook"}

// keepServiceCerts keeps, without Kubernetes (no token to review), a bootstrap credential for
// each of ServiceAccounts in dir/<service account>/ (cert-chain.pem, key.pem 0600,
// root-cert.pem): a service started with --provisioned-cert-dir on it authenticates its first
// CSR with it, then renews its own, locally generated key with its own certificate. Rewritten at
// half its lifetime and when another root signs, so a restarted service always finds a valid one.
func (s *Service) keepServiceCerts(ctx context.Context, dir string) error {
	owns := make([]*ownCredential, len(ServiceAccounts))
	for i, sa := range ServiceAccounts {
		owns[i] = &ownCredential{s: s, id: spiffe.ID{TrustDomain: s.cfg.TrustDomain, Namespace: s.cfg.Namespace, ServiceAccount: sa}}
	}
	return s.keepWritten(ctx, "the services' bootstrap certificates", dir, func() (time.Time, error) {
		next := time.Now().Add(min(ownCertTTL, s.cfg.MaxCertTTL))
		for _, o := range owns {
			c := o.Current()
			if c == nil {
				return time.Time{}, errNotLoaded
			}
			if err := writeCredentialFolder(filepath.Join(dir, o.id.ServiceAccount), c); err != nil {
				return time.Time{}, err
			}
			if h := halfLife(c.Leaf().NotBefore, c.Leaf().NotAfter); h.Before(next) {
				next = h
			}
		}
		s.log.Info("wrote the services' bootstrap certificates", "to", dir, "accounts", ServiceAccounts)
		return next, nil
	})
}

// writeCredentialFolder writes a credential in Istio's workload-spiffe-credentials layout, key
// first, each file atomically.
func writeCredentialFolder(dir string, c *workloadcert.Credential) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	for _, f := range []struct {
		name string
		data []byte
		mode os.FileMode
	}{{workloadcert.KeyFile, c.KeyPEM, 0o600}, {workloadcert.CertChainFile, c.ChainPEM, 0o644}, {workloadcert.RootCertFile, c.RootsPEM, 0o644}} {
		if err := replaceFile(filepath.Join(dir, f.name), f.data, f.mode); err != nil {
			return err
		}
	}
	return nil
}
