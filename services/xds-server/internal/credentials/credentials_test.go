package credentials

import (
	"crypto/x509"
	"encoding/pem"
	"errors"
	"math/big"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"sailplane.dev/shared/pki"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    Ref
		wantErr string
	}{
		{in: "kubernetes://gw-cert", want: Ref{Resource: "kubernetes://gw-cert", Namespace: "proxy-ns", Name: "gw-cert"}},
		{in: "kubernetes://gw/gw-cert", want: Ref{Resource: "kubernetes://gw/gw-cert", Namespace: "gw", Name: "gw-cert"}},
		{in: "kubernetes://gw-cert-cacert", want: Ref{Resource: "kubernetes://gw-cert-cacert", Namespace: "proxy-ns", Name: "gw-cert-cacert", CAOnly: true}},
		{in: "kubernetes-gateway://gw/gw-cert", want: Ref{Resource: "kubernetes-gateway://gw/gw-cert", Namespace: "gw", Name: "gw-cert"}},
		{in: "kubernetes-gateway://gw/ca-cacert", want: Ref{Resource: "kubernetes-gateway://gw/ca-cacert", Namespace: "gw", Name: "ca-cacert", CAOnly: true}},
		{in: "kubernetes-gateway://gw-cert", wantErr: "want kubernetes-gateway://<namespace>/<name>"},
		{in: "configmap://ns/ca", wantErr: "not a kubernetes:// secret"},
		{in: "default", wantErr: "not a kubernetes:// secret"},
		{in: "kubernetes://", wantErr: "want kubernetes://<name>"},
		{in: "kubernetes://a/b/c", wantErr: "want kubernetes://<name>"},
		{in: "kubernetes:///name", wantErr: "want kubernetes://<name>"},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := Parse(tc.in, "proxy-ns")
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Parse: %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("Parse = %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
	if _, err := Parse("configmap://ns/ca", "ns"); !errors.Is(err, ErrNotServed) {
		t.Errorf("configmap: %v, want ErrNotServed", err)
	}
}

// TestExtract: both of Istio's Secret layouts are read (generic keys first), and what is wrong
// with a Secret is named with its key, never its value.
func TestExtract(t *testing.T) {
	ca, err := pki.NewSelfSigned(pki.ECDSAP256, "test", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cert, key := pair(t, ca)
	_, otherKey := pair(t, ca)
	caPEM := pki.EncodeCerts(ca.Cert)
	crl := crlPEM(t, ca)
	for _, tc := range []struct {
		name     string
		data     map[string][]byte
		wantPair string // "" when the key pair is refused with pairErr
		pairErr  string
		wantCA   string // key the CA comes from, "" when refused with caErr
		caErr    string
	}{
		{name: "kubernetes.io/tls", data: map[string][]byte{"tls.crt": cert, "tls.key": key, "ca.crt": caPEM, "ca.crl": crl}, wantPair: "tls.crt", wantCA: "ca.crt"},
		{name: "generic", data: map[string][]byte{"cert": cert, "key": key, "cacert": caPEM, "crl": crl}, wantPair: "cert", wantCA: "cacert"},
		{name: "generic first", data: map[string][]byte{"cert": cert, "key": key, "tls.crt": []byte("x"), "tls.key": []byte("x"), "cacert": caPEM, "crl": crl, "ca.crt": []byte("x")},
			wantPair: "cert", wantCA: "cacert"},
		{name: "empty", data: map[string][]byte{"tls.crt": nil, "tls.key": nil, "ca.crt": nil},
			pairErr: `Secret ns/s: keys "tls.crt" and "tls.key" are empty`, caErr: `Secret ns/s: key "ca.crt" is empty`},
		{name: "other keys", data: map[string][]byte{"password": []byte("hunter2"), "user": []byte("me")},
			pairErr: "it has: password, user", caErr: "it has: password, user"},
		{name: "not PEM", data: map[string][]byte{"tls.crt": []byte("hunter2"), "tls.key": key, "ca.crt": []byte("hunter2")},
			pairErr: `key "tls.crt": no PEM certificate`, caErr: `key "ca.crt": no PEM certificate`},
		{name: "key PEM where the certificate goes", data: map[string][]byte{"tls.crt": key, "tls.key": key, "ca.crt": key},
			pairErr: `key "tls.crt": PEM block 1 is`, caErr: `key "ca.crt": PEM block 1 is`},
		{name: "key of another certificate", data: map[string][]byte{"tls.crt": cert, "tls.key": otherKey},
			pairErr: `key "tls.key" is not the private key of the certificate in "tls.crt"`, caErr: "has no CA certificate"},
		{name: "bad CRL", data: map[string][]byte{"ca.crt": caPEM, "ca.crl": cert}, pairErr: "has neither keys", caErr: `key "ca.crl": revocation list 1`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kp, err := extractKeyPair("ns/s", tc.data)
			switch {
			case tc.wantPair != "" && (err != nil || string(kp.cert) != string(tc.data[tc.wantPair])):
				t.Errorf("key pair: %v, want the one of %q", err, tc.wantPair)
			case tc.wantPair == "" && (err == nil || !strings.Contains(err.Error(), tc.pairErr)):
				t.Errorf("key pair: %v, want %q", err, tc.pairErr)
			}
			got, err := extractCA("ns/s", tc.data)
			switch {
			case tc.wantCA != "" && (err != nil || string(got.cert) != string(tc.data[tc.wantCA]) || len(got.crl) == 0):
				t.Errorf("CA: %v, want the one of %q with its CRL", err, tc.wantCA)
			case tc.wantCA == "" && (err == nil || !strings.Contains(err.Error(), tc.caErr)):
				t.Errorf("CA: %v, want %q", err, tc.caErr)
			}
			if err != nil && strings.Contains(err.Error(), "hunter2") {
				t.Errorf("error carries a value: %v", err)
			}
		})
	}
}

func pair(t *testing.T, ca *pki.Authority) (cert, key []byte) {
	t.Helper()
	k, err := pki.GenerateKey(pki.ECDSAP256)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.Issue(k.Public(), pki.LeafOptions{DNSNames: []string{"www.example.com"}, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if key, err = pki.EncodeKey(k); err != nil {
		t.Fatal(err)
	}
	return pki.EncodeCerts(leaf), key
}

func crlPEM(t *testing.T, ca *pki.Authority) []byte {
	t.Helper()
	der, err := x509.CreateRevocationList(nil, &x509.RevocationList{Number: big.NewInt(1), ThisUpdate: time.Now(), NextUpdate: time.Now().Add(time.Hour)},
		ca.Cert, ca.Key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "X509 CRL", Bytes: der})
}
