package workloadcert

import (
	"context"
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	pb "istio.io/api/security/v1alpha1"

	"sailplane.dev/shared/pki"
	"sailplane.dev/shared/spiffe"
)

// Issue asks the ca for a certificate for a fresh key, authenticated with the first credential
// that works: the current certificate, the provisioned one, then the token.
func (cl *Client) Issue(ctx context.Context) (*Credential, error) {
	rootsPEM, err := os.ReadFile(cl.cfg.RootCertFile)
	if err != nil {
		return nil, fmt.Errorf("root certificate: %w", err)
	}
	roots, err := pki.ParseCerts(rootsPEM)
	if err == nil && len(roots) == 0 {
		err = errors.New("no certificate")
	}
	if err != nil {
		return nil, fmt.Errorf("root certificate %s: %w", cl.cfg.RootCertFile, err)
	}
	pool := x509.NewCertPool()
	for _, r := range roots {
		pool.AddCert(r)
	}
	// The bundle of the last answer too: during a root rotation it holds the new root before a
	// copy of the root file (outside Kubernetes, say) does, and the ca may already serve with it.
	if c := cl.Current(); c != nil {
		for _, r := range c.Roots {
			pool.AddCert(r)
		}
	}
	key, err := pki.GenerateKey(cl.cfg.KeyAlgorithm)
	if err != nil {
		return nil, err
	}

	var refusals []error
	for _, auth := range cl.authenticators() {
		c, err := cl.request(ctx, pool, key, auth)
		if err == nil {
			return c, nil
		}
		if errors.Is(err, errUnreachable) {
			return nil, err
		}
		refusals = append(refusals, err)
	}
	if len(refusals) == 0 {
		return nil, errors.New("no credential to authenticate with: no valid certificate and no token")
	}
	return nil, errors.Join(refusals...)
}

// authenticator is one way of proving the workload's identity to the ca.
type authenticator struct {
	name  string
	id    spiffe.ID // the identity the CSR names
	cert  *tls.Certificate
	token string
}

func (cl *Client) authenticators() []authenticator {
	var out []authenticator
	now := time.Now()
	if c := cl.Current(); c != nil && now.Before(c.Leaf().NotAfter) {
		t := c.TLSCertificate()
		out = append(out, authenticator{name: "certificate", id: c.ID, cert: &t})
	}
	if dir := cl.cfg.ProvisionedCertDir; dir != "" && len(out) == 0 {
		if auth, err := provisioned(dir); err != nil {
			cl.log.Debug("provisioned certificate unusable", "dir", dir, "error", err)
		} else if now.Before(auth.cert.Leaf.NotAfter) {
			out = append(out, auth)
		}
	}
	if cl.cfg.TokenFile != "" {
		if data, err := os.ReadFile(cl.cfg.TokenFile); err != nil {
			cl.log.Debug("token unreadable", "file", cl.cfg.TokenFile, "error", err)
		} else if token := strings.TrimSpace(string(data)); token != "" {
			id, err := tokenIdentity(token)
			if err != nil {
				cl.log.Debug("token unusable", "file", cl.cfg.TokenFile, "error", err)
			} else {
				id.TrustDomain = cl.cfg.TrustDomain
				out = append(out, authenticator{name: "token", id: id, token: token})
			}
		}
	}
	return out
}

// provisioned reads a certificate and key given to the workload out of band (a VM's).
func provisioned(dir string) (authenticator, error) {
	c, err := ReadFolder(dir)
	if err != nil {
		return authenticator{}, err
	}
	t := c.TLSCertificate()
	return authenticator{name: "provisioned certificate", id: c.ID, cert: &t}, nil
}

// ReadFolder reads a credential folder in Istio's workload-spiffe-credentials layout:
// cert-chain.pem (the leaf with one SPIFFE ID, then intermediates) and key.pem, and the roots
// from root-cert.pem when it is there (a provisioned folder may have none).
func ReadFolder(dir string) (*Credential, error) {
	t, err := tls.LoadX509KeyPair(filepath.Join(dir, CertChainFile), filepath.Join(dir, KeyFile))
	if err != nil {
		return nil, err
	}
	key, ok := t.PrivateKey.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("%s: not a signing key", filepath.Join(dir, KeyFile))
	}
	id, err := identityOf(t.Leaf)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, CertChainFile), err)
	}
	c := &Credential{ID: id, Key: key, Received: time.Now()}
	for _, raw := range t.Certificate {
		x, err := x509.ParseCertificate(raw)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", filepath.Join(dir, CertChainFile), err)
		}
		c.Chain = append(c.Chain, x)
	}
	c.ChainPEM = pki.EncodeCerts(c.Chain...)
	if c.KeyPEM, err = pki.EncodeKey(key); err != nil {
		return nil, err
	}
	if c.RootsPEM, err = os.ReadFile(filepath.Join(dir, RootCertFile)); err == nil {
		if c.Roots, err = pki.ParseCerts(c.RootsPEM); err != nil {
			return nil, fmt.Errorf("%s: %w", filepath.Join(dir, RootCertFile), err)
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	return c, nil
}

// tokenIdentity reads the service account a Kubernetes token names (its sub claim). The token
// is not verified here: the ca does that; this only names the identity in the CSR.
func tokenIdentity(token string) (spiffe.ID, error) {
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return spiffe.ID{}, errors.New("not a JWT")
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return spiffe.ID{}, fmt.Errorf("JWT payload: %w", err)
	}
	var claims struct {
		Sub string `json:"sub"`
	}
	if err := json.Unmarshal(payload, &claims); err != nil {
		return spiffe.ID{}, fmt.Errorf("JWT payload: %w", err)
	}
	return spiffe.FromServiceAccountUser("", claims.Sub)
}

const requestTimeout = 15 * time.Second

// request sends one CSR for key, authenticated with auth, and checks the answer.
func (cl *Client) request(ctx context.Context, roots *x509.CertPool, key crypto.Signer, auth authenticator) (*Credential, error) {
	csr, err := pki.CreateCSR(key, auth.id)
	if err != nil {
		return nil, err
	}
	tlsCfg := &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: roots}
	if auth.cert != nil {
		tlsCfg.Certificates = []tls.Certificate{*auth.cert}
	}
	opts := append([]grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(tlsCfg))}, cl.dialOpts...)
	conn, err := grpc.NewClient(cl.cfg.CAAddress, opts...)
	if err != nil {
		return nil, fmt.Errorf("ca address %q: %w", cl.cfg.CAAddress, err)
	}
	defer conn.Close()

	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, "clusterid", cl.cfg.ClusterID)
	if auth.token != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+auth.token)
	}
	resp, err := pb.NewIstioCertificateServiceClient(conn).CreateCertificate(ctx, &pb.IstioCertificateRequest{
		Csr: string(csr), ValidityDuration: int64(cl.cfg.CertTTL / time.Second),
	})
	if err != nil {
		switch status.Code(err) {
		case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled:
			return nil, fmt.Errorf("%w: %s: %w", errUnreachable, cl.cfg.CAAddress, err)
		}
		return nil, fmt.Errorf("%w (%s): %w", ErrCA, auth.name, err)
	}
	c, err := credentialFrom(key, resp.GetCertChain())
	if err != nil {
		return nil, fmt.Errorf("the ca's answer (%s): %w", auth.name, err)
	}
	return c, nil
}

// credentialFrom checks the ca's answer: leaf first, then intermediates, the trust bundle last;
// the leaf is for key, has one SPIFFE ID and chains to the bundle.
func credentialFrom(key crypto.Signer, chainPEM []string) (*Credential, error) {
	if len(chainPEM) < 2 {
		return nil, fmt.Errorf("%d entries in cert_chain, want the certificate and the roots", len(chainPEM))
	}
	var chain []*x509.Certificate
	for i, p := range chainPEM[:len(chainPEM)-1] {
		certs, err := pki.ParseCerts([]byte(p))
		if err != nil {
			return nil, fmt.Errorf("cert_chain[%d]: %w", i, err)
		}
		chain = append(chain, certs...)
	}
	roots, err := pki.ParseCerts([]byte(chainPEM[len(chainPEM)-1]))
	if err != nil {
		return nil, fmt.Errorf("roots: %w", err)
	}
	if len(chain) == 0 || len(roots) == 0 {
		return nil, errors.New("no certificate or no root")
	}
	leaf := chain[0]
	if !pki.PublicKeysEqual(leaf.PublicKey, key.Public()) {
		return nil, errors.New("the certificate is not for the key the CSR carried")
	}
	if len(leaf.URIs) != 1 {
		return nil, fmt.Errorf("the certificate has %d URI SANs, want one SPIFFE ID", len(leaf.URIs))
	}
	id, err := spiffe.FromURL(leaf.URIs[0])
	if err != nil {
		return nil, err
	}
	pool, inter := x509.NewCertPool(), x509.NewCertPool()
	for _, r := range roots {
		pool.AddCert(r)
	}
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		return nil, fmt.Errorf("the certificate does not chain to the roots sent with it: %w", err)
	}
	keyPEM, err := pki.EncodeKey(key)
	if err != nil {
		return nil, err
	}
	return &Credential{
		ID: id, Key: key, Chain: chain, Roots: roots,
		KeyPEM: keyPEM, ChainPEM: pki.EncodeCerts(chain...), RootsPEM: pki.EncodeCerts(roots...),
		Received: time.Now(),
	}, nil
}
