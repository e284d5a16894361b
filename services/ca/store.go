package ca

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"sailplane.dev/shared/pki"
)

// Istio's names for where a CA lives in Kubernetes.
const (
	// RootSecret holds the self-signed root istiod (and this ca) generates.
	RootSecret = "istio-ca-secret"
	// PluggedSecret holds a plugged-in CA (Istio's cacerts).
	PluggedSecret = "cacerts"
	// RootSecretType is the type istiod gives RootSecret.
	RootSecretType corev1.SecretType = "istio.io/ca-root"
)

var layoutFiles = []string{pki.CACertFile, pki.CAKeyFile, pki.CertChainFile, pki.RootCertFile}

// loadAuthority finds the root of trust: a plugged-in folder, else a plugged-in Secret, else
// the self-signed root (folder or Secret), generated and stored only when none is stored.
func (s *Service) loadAuthority(ctx context.Context) (rootState, error) {
	plugged := func(auth *pki.Authority, err error) (rootState, error) { return rootState{auth: auth}, err }
	if dir := s.cfg.PluggedCertDir; dir != "" {
		files, err := readLayout(dir)
		if err != nil {
			return rootState{}, fmt.Errorf("%w: plugged-in CA folder %s: %w", ErrStoredCA, dir, err)
		}
		if len(files) == 0 {
			return rootState{}, fmt.Errorf("%w: plugged-in CA folder %s holds none of %v", ErrStoredCA, dir, layoutFiles)
		}
		return plugged(fromLayout("plugged-in CA folder "+dir, files))
	}
	if s.cfg.CertDir != "" {
		return s.folderRoot(s.cfg.CertDir)
	}
	secrets := s.kube.CoreV1().Secrets(s.cfg.Namespace)
	pluggedSecret, err := secrets.Get(ctx, PluggedSecret, metav1.GetOptions{})
	switch {
	case err == nil:
		return plugged(fromLayout(secretName(pluggedSecret), pluggedSecret.Data))
	case !apierrors.IsNotFound(err):
		return rootState{}, fmt.Errorf("%w: read Secret %s/%s: %w", ErrKubernetes, s.cfg.Namespace, PluggedSecret, err)
	}
	stored, err := secrets.Get(ctx, RootSecret, metav1.GetOptions{})
	switch {
	case err == nil:
		return secretState(stored)
	case !apierrors.IsNotFound(err):
		return rootState{}, fmt.Errorf("%w: read Secret %s/%s: %w", ErrKubernetes, s.cfg.Namespace, RootSecret, err)
	}

	auth, files, err := s.newRoot()
	if err != nil {
		return rootState{}, err
	}
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: RootSecret, Namespace: s.cfg.Namespace},
		Type:       RootSecretType,
		Data:       files,
	}
	// Create, never Update: of replicas racing to store a root, one wins and the others use it.
	_, err = secrets.Create(ctx, secret, metav1.CreateOptions{})
	switch {
	case err == nil:
		s.log.Info("generated a self-signed root", "secret", secretName(secret))
		return rootState{auth: auth, rotatable: true}, nil
	case apierrors.IsAlreadyExists(err):
		winner, err := secrets.Get(ctx, RootSecret, metav1.GetOptions{})
		if err != nil {
			return rootState{}, fmt.Errorf("%w: read Secret %s/%s another replica created: %w", ErrKubernetes, s.cfg.Namespace, RootSecret, err)
		}
		s.log.Info("another replica stored the root first; using it", "secret", secretName(winner))
		return secretState(winner)
	default:
		return rootState{}, fmt.Errorf("%w: create Secret %s/%s: %w", ErrKubernetes, s.cfg.Namespace, RootSecret, err)
	}
}

func secretName(s *corev1.Secret) string { return "Secret " + s.Namespace + "/" + s.Name }

func fromLayout(where string, files map[string][]byte) (*pki.Authority, error) {
	auth, err := pki.FromIstioLayout(files)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w (fix or remove it; a new root would invalidate every workload certificate)", ErrStoredCA, where, err)
	}
	return auth, nil
}

func (s *Service) newRoot() (*pki.Authority, map[string][]byte, error) {
	auth, err := pki.NewSelfSigned(s.cfg.KeyAlgorithm, s.cfg.TrustDomain, s.cfg.RootTTL)
	if err != nil {
		return nil, nil, fmt.Errorf("generate root: %w", err)
	}
	files, err := pki.IstioLayout(auth)
	if err != nil {
		return nil, nil, err
	}
	return auth, files, nil
}

// folderRoot loads the root from dir, with its rotation (finishing on disk a step a crash cut
// short), or generates one there when dir holds none of its files.
func (s *Service) folderRoot(dir string) (rootState, error) {
	files, err := readLayout(dir)
	if err != nil {
		return rootState{}, fmt.Errorf("%w: %s: %w", ErrStoredCA, dir, err)
	}
	if len(files) > 0 {
		rotation, err := readFiles(dir, rotationFiles)
		if err == nil {
			maps.Copy(files, rotation)
			err = switchingTo(files)
		}
		if err != nil {
			return rootState{}, fmt.Errorf("%w: %s: %w", ErrStoredCA, dir, err)
		}
		auth, err := fromLayout("folder "+dir, files)
		if err != nil {
			return rootState{}, err
		}
		st, err := rotationFrom(files, auth)
		if err == nil && st.rotation.Phase != "" {
			err = writeRotation(dir, st)
		}
		if err != nil {
			return rootState{}, fmt.Errorf("%w: %s: %w", ErrStoredCA, dir, err)
		}
		return st, nil
	}
	auth, files, err := s.newRoot()
	if err != nil {
		return rootState{}, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return rootState{}, fmt.Errorf("root folder: %w", err)
	}
	// The key is written last: until it exists the folder is incomplete, which the next start
	// reports instead of generating over it.
	for _, name := range []string{pki.RootCertFile, pki.CertChainFile, pki.CACertFile, pki.CAKeyFile} {
		if err := writeNew(filepath.Join(dir, name), files[name]); err != nil {
			return rootState{}, err
		}
	}
	s.log.Info("generated a self-signed root", "folder", dir)
	return rootState{auth: auth, rotatable: true}, nil
}

// readLayout reads the files of Istio's CA layout present in dir; a missing dir reads as none.
func readLayout(dir string) (map[string][]byte, error) { return readFiles(dir, layoutFiles) }

// readFiles reads the named files present in dir.
func readFiles(dir string, names []string) (map[string][]byte, error) {
	files := map[string][]byte{}
	for _, name := range names {
		data, err := os.ReadFile(filepath.Join(dir, name))
		switch {
		case err == nil:
			files[name] = data
		case errors.Is(err, fs.ErrNotExist):
		default:
			return nil, err
		}
	}
	return files, nil
}

// writeNew writes a file that must not exist yet (0600: the key is among them), through a
// temporary file so it is never seen half-written.
func writeNew(path string, data []byte) error {
	return writeVia(path, data, 0o600, func(tmp string) error {
		if err := os.Link(tmp, path); err != nil {
			return fmt.Errorf("store root: %w", err)
		}
		return nil
	})
}

// writeVia writes data with mode to a temporary file beside path, hands it to place (which
// links or renames it to path), and removes the temporary name.
func writeVia(path string, data []byte, mode os.FileMode, place func(tmp string) error) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".tmp-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	_, err = tmp.Write(data)
	if err == nil {
		err = tmp.Chmod(mode)
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return place(tmp.Name())
}
