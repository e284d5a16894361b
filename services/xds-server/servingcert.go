package xdsserver

import (
	"crypto/tls"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// Files of a serving-certificate folder, as the ca writes it (--serving-cert-dir) and as a
// mounted kubernetes.io/tls Secret holds it.
const (
	servingCertFile = "tls.crt"
	servingKeyFile  = "tls.key"
)

// FolderTLS is the TLS config of the secure listener when its certificate is kept in dir by the
// ca: the pair is re-read whenever its files change, so a renewed certificate is served without
// a restart; a half-written or mismatched pair keeps the previous one. Until the folder holds a
// pair, handshakes fail (clients retry).
func FolderTLS(dir string) *tls.Config {
	fc := &folderCert{dir: dir}
	return ServingTLS(fc.get)
}

// ServingTLS is the TLS config of the secure listener serving the certificate get returns.
// Workloads with a certificate from the ca present it (mTLS, as to istiod's 15012): it is
// requested, and verified against the trust bundle per stream, so a client without one still
// connects.
func ServingTLS(get func(*tls.ClientHelloInfo) (*tls.Certificate, error)) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12, GetCertificate: get, NextProtos: []string{"h2"},
		ClientAuth: tls.RequestClientCert,
	}
}

type folderCert struct {
	dir string

	mu       sync.Mutex
	modified [2]time.Time
	current  *tls.Certificate
}

func (fc *folderCert) get(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	certPath, keyPath := filepath.Join(fc.dir, servingCertFile), filepath.Join(fc.dir, servingKeyFile)
	var modified [2]time.Time
	for i, p := range []string{certPath, keyPath} {
		st, err := os.Stat(p)
		if err != nil {
			return fc.previous(fmt.Errorf("serving certificate: %w", err))
		}
		modified[i] = st.ModTime()
	}
	fc.mu.Lock()
	defer fc.mu.Unlock()
	if fc.current != nil && modified == fc.modified {
		return fc.current, nil
	}
	pair, err := tls.LoadX509KeyPair(certPath, keyPath)
	if err != nil {
		if fc.current != nil {
			return fc.current, nil // mid-renewal: the next handshake takes the new pair
		}
		return nil, fmt.Errorf("serving certificate in %s: %w", fc.dir, err)
	}
	fc.current, fc.modified = &pair, modified
	return fc.current, nil
}

// previous is the pair read last, or err when none was.
func (fc *folderCert) previous(err error) (*tls.Certificate, error) {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	if fc.current != nil {
		return fc.current, nil
	}
	return nil, err
}
