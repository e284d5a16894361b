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

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"sailplane.dev/shared/pki"
)

// Files of a serving certificate kept for another server: a folder, or a kubernetes.io/tls
// Secret (the same names, so a mounted Secret is read as a folder).
const (
	ServingCertFile = "tls.crt" // the leaf, then its intermediates
	ServingKeyFile  = "tls.key"
	ServingRootFile = "ca.crt" // the trust bundle
)

// keepServingCert keeps a serving certificate for cfg.ServingDNSNames where write puts it (a
// folder, a Secret), for a server that does not ask the ca itself (xds-server with
// --tls-cert-dir): written at once, again at half its lifetime or when a root rotation steps,
// until ctx ends.
func (s *Service) keepServingCert(ctx context.Context, where string, write func(map[string][]byte) error) error {
	return s.keepWritten(ctx, "the serving certificate", where, func() (time.Time, error) {
		s.mu.Lock()
		serving, auth := s.serving, s.auth
		s.mu.Unlock()
		c, err := serving.GetCertificate(nil)
		if err != nil {
			return time.Time{}, err
		}
		files, err := servingFiles(c, auth)
		if err == nil {
			err = write(files)
		}
		if err != nil {
			return time.Time{}, err
		}
		s.log.Info("wrote a serving certificate", "to", where, "names", s.cfg.ServingDNSNames, "expires", c.Leaf.NotAfter.UTC().Format(time.RFC3339))
		return halfLife(c.Leaf.NotBefore, c.Leaf.NotAfter), nil
	})
}

// keepWritten runs write at once, again at the time it returns and whenever a root rotation
// step changes the authority, until ctx ends. A failed write is logged and retried with backoff.
func (s *Service) keepWritten(ctx context.Context, what, where string, write func() (next time.Time, err error)) error {
	for retry := time.Second; ; {
		s.mu.Lock()
		rotated := s.rotated
		s.mu.Unlock()
		next, err := write()
		if err == nil {
			retry = time.Second
		} else {
			s.log.Warn("cannot write "+what+"; retrying", "to", where, "error", err, "retry-in", retry)
			next = time.Now().Add(retry)
			retry = min(2*retry, time.Minute)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(time.Until(next)):
		case <-rotated: // another root signs, or the bundle changed
		}
	}
}

// servingFiles is a serving certificate as the files of a kubernetes.io/tls Secret.
func servingFiles(c *tls.Certificate, auth *pki.Authority) (map[string][]byte, error) {
	key, err := pki.EncodeKey(c.PrivateKey.(crypto.Signer))
	if err != nil {
		return nil, err
	}
	return map[string][]byte{
		ServingCertFile: pki.EncodeCerts(append([]*x509.Certificate{c.Leaf}, auth.Chain()...)...),
		ServingKeyFile:  key,
		ServingRootFile: pki.EncodeCerts(auth.Roots...),
	}, nil
}

// writeServingFolder replaces the folder's files one by one, each atomically; a reader that sees
// a new key beside the old certificate finds a mismatched pair and keeps its previous one.
func writeServingFolder(dir string, files map[string][]byte) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, name := range []string{ServingRootFile, ServingKeyFile, ServingCertFile} {
		mode := os.FileMode(0o644)
		if name == ServingKeyFile {
			mode = 0o600
		}
		if err := replaceFile(filepath.Join(dir, name), files[name], mode); err != nil {
			return err
		}
	}
	return nil
}

// writeServingSecret creates or updates a kubernetes.io/tls Secret with files.
func (s *Service) writeServingSecret(ctx context.Context, namespace, name string, files map[string][]byte) error {
	secrets := s.kube.CoreV1().Secrets(namespace)
	current, err := secrets.Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		_, err = secrets.Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
			Type:       corev1.SecretTypeTLS,
			Data:       files,
		}, metav1.CreateOptions{})
		return err
	case err != nil:
		return err
	case current.Type != corev1.SecretTypeTLS:
		return fmt.Errorf("Secret %s/%s has type %q, not %s: not overwriting it", namespace, name, current.Type, corev1.SecretTypeTLS)
	}
	current.Data = files
	_, err = secrets.Update(ctx, current, metav1.UpdateOptions{})
	return err
}

// replaceFile writes path through a temporary file renamed over it.
func replaceFile(path string, data []byte, mode os.FileMode) error {
	return writeVia(path, data, mode, func(tmp string) error { return os.Rename(tmp, path) })
}
