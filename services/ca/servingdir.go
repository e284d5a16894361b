package ca

import (
	"context"
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"sailplane.dev/shared/pki"
)

// Files of a serving-certificate folder (the names of a kubernetes.io/tls Secret, so the same
// reader takes a mounted Secret later).
const (
	ServingCertFile = "tls.crt" // the leaf, then its intermediates
	ServingKeyFile  = "tls.key"
	ServingRootFile = "ca.crt" // the trust bundle
)

// writeServingDir keeps a serving certificate for cfg.ServingDNSNames in dir, for a server that
// cannot ask the ca itself (xds-server in microservices mode serving TLS on 15012), renewed at
// half its lifetime until ctx ends.
func (s *Service) writeServingDir(ctx context.Context, serving *servingCert, dir string) error {
	for {
		c, err := serving.get(nil)
		if err != nil {
			return fmt.Errorf("ca: serving certificate for %s: %w", dir, err)
		}
		if err := writeServingFiles(dir, c, serving.auth.Chain(), pki.EncodeCerts(serving.auth.Roots...)); err != nil {
			return fmt.Errorf("ca: serving certificate folder %s: %w", dir, err)
		}
		s.log.Info("wrote a serving certificate", "folder", dir, "names", serving.names, "expires", c.Leaf.NotAfter.UTC().Format(time.RFC3339))
		half := c.Leaf.NotBefore.Add(c.Leaf.NotAfter.Sub(c.Leaf.NotBefore) / 2)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(time.Until(half)):
		}
	}
}

// writeServingFiles replaces the folder's files one by one, each atomically; a reader that sees
// a new key beside the old certificate finds a mismatched pair and keeps its previous one.
func writeServingFiles(dir string, c *tls.Certificate, chain []*x509.Certificate, roots []byte) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	key, err := pki.EncodeKey(c.PrivateKey.(crypto.Signer))
	if err != nil {
		return err
	}
	for _, f := range []struct {
		name string
		data []byte
		mode os.FileMode
	}{
		{ServingRootFile, roots, 0o644},
		{ServingKeyFile, key, 0o600},
		{ServingCertFile, pki.EncodeCerts(append([]*x509.Certificate{c.Leaf}, chain...)...), 0o644},
	} {
		if err := replaceFile(filepath.Join(dir, f.name), f.data, f.mode); err != nil {
			return err
		}
	}
	return nil
}

// replaceFile writes path through a temporary file renamed over it.
func replaceFile(path string, data []byte, mode os.FileMode) error {
	return writeVia(path, data, mode, func(tmp string) error { return os.Rename(tmp, path) })
}
