package ca

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"sailplane.dev/shared/pki"
)

// Rotation of the self-signed root (Secret or folder), in three steps, each kept beside the
// root before it takes effect so a restart resumes where it was:
//
//	trust-new: a new root is added to the bundle; signing stays with the old one.
//	sign-new:  after the grace period, signing switches to the new root; both stay trusted.
//	done:      after MaxCertTTL more (every leaf of the old root has expired), the old root is
//	           dropped from the bundle.
const (
	phaseTrustNew = "trust-new"
	phaseSignNew  = "sign-new"
)

// What a rotation keeps beside the root while it runs: files of the folder, or keys of
// istio-ca-secret (updated in one write).
const (
	NextCACertFile = "next-ca-cert.pem" // the new root, until signing switches to it
	NextCAKeyFile  = "next-ca-key.pem"
	RotationFile   = "root-rotation.json" // the phase and when it began
)

// rotationState is RotationFile.
type rotationState struct {
	Phase string    `json:"phase"`
	Since time.Time `json:"since"`
}

// rootState is the root of trust with its rotation, if one runs.
type rootState struct {
	auth      *pki.Authority // signs; its Roots are the bundle
	next      *pki.Authority // phaseTrustNew: the new root
	rotation  rotationState  // zero: no rotation
	rotatable bool           // a self-signed root this ca keeps (not a plugged-in CA)
}

// rotates reports whether the setting asks to replace root: it was created before RotateRootBefore
// (to the second, a certificate's precision). The new root is created once that time has come, so
// it is never replaced in turn.
func rotates(root *x509.Certificate, before time.Time) bool {
	return !before.IsZero() && root.NotBefore.Add(pki.ClockSkew).Before(before.Truncate(time.Second))
}

// due is when st's current phase ends; false when nothing is to be done (no rotation runs and
// none is asked for).
func (s *Service) due(st rootState) (time.Time, bool) {
	if !st.rotatable {
		return time.Time{}, false
	}
	switch st.rotation.Phase {
	case phaseTrustNew:
		return st.rotation.Since.Add(s.cfg.RootRotationGrace), true
	case phaseSignNew:
		return st.rotation.Since.Add(s.cfg.MaxCertTTL), true
	}
	return s.cfg.RotateRootBefore, rotates(st.auth.Cert, s.cfg.RotateRootBefore)
}

// step is the state after st's current phase, taken at now.
func (s *Service) step(st rootState, now time.Time) (rootState, error) {
	switch st.rotation.Phase {
	case phaseTrustNew:
		auth, err := pki.NewAuthority(st.next.Cert, st.next.Key, nil, []*x509.Certificate{st.next.Cert, st.auth.Cert})
		return rootState{auth: auth, rotation: rotationState{Phase: phaseSignNew, Since: now}, rotatable: true}, err
	case phaseSignNew:
		auth, err := pki.NewAuthority(st.auth.Cert, st.auth.Key, nil, []*x509.Certificate{st.auth.Cert})
		return rootState{auth: auth, rotatable: true}, err
	}
	next, err := pki.NewSelfSigned(s.cfg.KeyAlgorithm, s.cfg.TrustDomain, s.cfg.RootTTL)
	if err != nil {
		return rootState{}, fmt.Errorf("generate the new root: %w", err)
	}
	auth, err := pki.NewAuthority(st.auth.Cert, st.auth.Key, nil, []*x509.Certificate{st.auth.Cert, next.Cert})
	return rootState{auth: auth, next: next, rotation: rotationState{Phase: phaseTrustNew, Since: now}, rotatable: true}, err
}

// rotationFiles are the keys (file names) a rotation keeps beside the root.
var rotationFiles = []string{NextCACertFile, NextCAKeyFile, RotationFile}

// rotationFrom completes the root (auth, as the layout's files read) with the rotation files kept
// beside it (files holds both), finishing in memory a step a crash cut short. Rotation files of a
// rotation that never began (no RotationFile) are ignored.
func rotationFrom(files map[string][]byte, auth *pki.Authority) (rootState, error) {
	st := rootState{auth: auth, rotatable: true}
	data := files[RotationFile]
	if data == nil {
		return st, nil
	}
	if err := json.Unmarshal(data, &st.rotation); err != nil {
		return st, fmt.Errorf("%s: %w", RotationFile, err)
	}
	var next *pki.Authority
	if files[NextCACertFile] != nil && files[NextCAKeyFile] != nil {
		var err error
		next, err = pki.FromIstioLayout(map[string][]byte{pki.CACertFile: files[NextCACertFile], pki.CAKeyFile: files[NextCAKeyFile]})
		if err != nil {
			return st, fmt.Errorf("%s/%s: %w", NextCACertFile, NextCAKeyFile, err)
		}
	}
	// The old root, whichever step was cut short: the bundle's root that does not sign.
	others := func(signing *x509.Certificate) []*x509.Certificate {
		return slices.DeleteFunc(slices.Clone(auth.Roots), func(c *x509.Certificate) bool { return c.Equal(signing) })
	}
	var err error
	switch st.rotation.Phase {
	case phaseTrustNew:
		if next == nil {
			return st, fmt.Errorf("%s says %s but %s/%s are missing", RotationFile, phaseTrustNew, NextCACertFile, NextCAKeyFile)
		}
		st.next = next
		st.auth, err = pki.NewAuthority(auth.Cert, auth.Key, nil, []*x509.Certificate{auth.Cert, next.Cert})
	case phaseSignNew:
		signing := auth
		if next != nil { // the switch was cut short: the next root signs
			signing = next
		}
		st.auth, err = pki.NewAuthority(signing.Cert, signing.Key, nil, append([]*x509.Certificate{signing.Cert}, others(signing.Cert)...))
	default:
		return st, fmt.Errorf("%s: unknown phase %q (want %s or %s)", RotationFile, st.rotation.Phase, phaseTrustNew, phaseSignNew)
	}
	return st, err
}

// switchingTo puts the next root in files' ca-cert.pem and ca-key.pem when a switch to it was
// cut short (the rotation file says sign-new and the next root's files are still there): the
// two files may then hold one old and one new half.
func switchingTo(files map[string][]byte) error {
	if files[RotationFile] == nil {
		return nil
	}
	var st rotationState
	if err := json.Unmarshal(files[RotationFile], &st); err != nil {
		return fmt.Errorf("%s: %w", RotationFile, err)
	}
	if st.Phase == phaseSignNew && files[NextCACertFile] != nil && files[NextCAKeyFile] != nil {
		files[pki.CACertFile], files[pki.CAKeyFile] = files[NextCACertFile], files[NextCAKeyFile]
	}
	return nil
}

// rotationData is st as the Secret's data: istio-ca-secret's keys and the rotation's.
func rotationData(st rootState) (map[string][]byte, error) {
	data, err := pki.IstioLayout(st.auth)
	if err != nil {
		return nil, err
	}
	if st.next != nil {
		if data[NextCAKeyFile], err = pki.EncodeKey(st.next.Key); err != nil {
			return nil, err
		}
		data[NextCACertFile] = pki.EncodeCerts(st.next.Cert)
	}
	if st.rotation.Phase != "" {
		if data[RotationFile], err = json.Marshal(st.rotation); err != nil {
			return nil, err
		}
	}
	return data, nil
}

// writeRotation writes st to dir, each file atomically, in an order where a crash at any point
// leaves what folderRoot reads as st or as the state before it: the RotationFile is the
// commit point of a step.
func writeRotation(dir string, st rootState) error {
	write := func(name string, data []byte) error { return replaceFile(filepath.Join(dir, name), data, 0o600) }
	encodeKey := func(a *pki.Authority) []byte {
		key, _ := pki.EncodeKey(a.Key) // a key read or generated here always encodes
		return key
	}
	writeState := func() error {
		data, err := json.Marshal(st.rotation)
		if err != nil {
			return err
		}
		return write(RotationFile, data)
	}
	var steps []func() error
	switch st.rotation.Phase {
	case phaseTrustNew:
		steps = []func() error{
			func() error { return write(NextCAKeyFile, encodeKey(st.next)) },
			func() error { return write(NextCACertFile, pki.EncodeCerts(st.next.Cert)) },
			writeState,
		}
	case phaseSignNew:
		steps = []func() error{
			writeState,
			func() error { return write(pki.CAKeyFile, encodeKey(st.auth)) },
			func() error { return write(pki.CACertFile, pki.EncodeCerts(st.auth.Cert)) },
		}
	}
	steps = append(steps, func() error { return write(pki.RootCertFile, pki.EncodeCerts(st.auth.Roots...)) })
	if st.rotation.Phase != phaseTrustNew {
		steps = append(steps, func() error { return removeAll(dir, NextCACertFile, NextCAKeyFile) })
	}
	if st.rotation.Phase == "" {
		steps = append(steps, func() error { return removeAll(dir, RotationFile) })
	}
	for _, f := range steps {
		if err := f(); err != nil {
			return fmt.Errorf("root rotation: %w", err)
		}
	}
	return nil
}

func removeAll(dir string, names ...string) error {
	for _, n := range names {
		if err := os.Remove(filepath.Join(dir, n)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return nil
}

// runRotation takes the rotation through its steps as their times come, each persisted, then
// installed (signing, bundle on the bus, serving certificate). It returns when ctx ends or no
// step is left.
func (s *Service) runRotation(ctx context.Context, st rootState) error {
	for {
		at, ok := s.due(st)
		if !ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(time.Until(at)):
		}
		next, err := s.step(st, time.Now())
		if err != nil {
			return fmt.Errorf("ca: root rotation: %w", err)
		}
		next, err = s.persist(ctx, st, next)
		if err != nil {
			s.log.Warn("cannot keep the root rotation's next step; retrying", "error", err)
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(time.Second):
			}
			continue
		}
		if err := s.install(next.auth); err != nil {
			return err
		}
		s.log.Info("root rotation", "phase", phaseName(next.rotation.Phase), "signing-root", next.auth.Cert.SerialNumber.Text(16), "roots", len(next.auth.Roots))
		st = next
	}
}

func phaseName(p string) string {
	if p == "" {
		return "done"
	}
	return p
}

// persist keeps next where the root is, before it takes effect. In a Secret, another replica may
// have stepped first: then what it stored is returned, to be installed instead.
func (s *Service) persist(ctx context.Context, current, next rootState) (rootState, error) {
	if s.cfg.CertDir != "" {
		return next, writeRotation(s.cfg.CertDir, next)
	}
	secrets := s.kube.CoreV1().Secrets(s.cfg.Namespace)
	stored, err := secrets.Get(ctx, RootSecret, metav1.GetOptions{})
	if err != nil {
		return next, fmt.Errorf("read Secret %s/%s: %w", s.cfg.Namespace, RootSecret, err)
	}
	theirs, err := secretState(stored)
	if err != nil {
		return next, err
	}
	if theirs.rotation != current.rotation || !theirs.auth.Cert.Equal(current.auth.Cert) || len(theirs.auth.Roots) != len(current.auth.Roots) {
		return theirs, nil
	}
	if stored.Data, err = rotationData(next); err != nil {
		return next, err
	}
	if _, err := secrets.Update(ctx, stored, metav1.UpdateOptions{}); err != nil {
		return next, fmt.Errorf("update Secret %s/%s: %w", s.cfg.Namespace, RootSecret, err)
	}
	return next, nil
}

// secretState is the root kept in istio-ca-secret, with its rotation.
func secretState(secret *corev1.Secret) (rootState, error) {
	files := maps.Clone(secret.Data)
	if err := switchingTo(files); err != nil {
		return rootState{}, fmt.Errorf("%w: %s: %w", ErrStoredCA, secretName(secret), err)
	}
	auth, err := fromLayout(secretName(secret), files)
	if err != nil {
		return rootState{}, err
	}
	st, err := rotationFrom(files, auth)
	if err != nil {
		return st, fmt.Errorf("%w: %s: %w", ErrStoredCA, secretName(secret), err)
	}
	return st, nil
}
