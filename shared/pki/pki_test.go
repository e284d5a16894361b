package pki

import (
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"sailplane.dev/shared/spiffe"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var workload = spiffe.ID{TrustDomain: "cluster.local", Namespace: "ns1", ServiceAccount: "sa1"}

func mustSelfSigned(t testing.TB, alg KeyAlgorithm) *Authority {
	t.Helper()
	a, err := NewSelfSigned(alg, "test", 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func TestGenerateKey(t *testing.T) {
	for alg, check := range map[KeyAlgorithm]func(any) bool{
		"":        func(k any) bool { _, ok := k.(*ecdsa.PrivateKey); return ok },
		ECDSAP256: func(k any) bool { k2, ok := k.(*ecdsa.PrivateKey); return ok && k2.Curve.Params().BitSize == 256 },
		RSA2048:   func(k any) bool { k2, ok := k.(*rsa.PrivateKey); return ok && k2.N.BitLen() == 2048 },
	} {
		k, err := GenerateKey(alg)
		if err != nil || !check(k) {
			t.Errorf("GenerateKey(%q) = %T, %v", alg, k, err)
		}
	}
	if _, err := GenerateKey("DSA"); err == nil {
		t.Error("GenerateKey(DSA) accepted")
	}
}

func TestIssueLeafForCSR(t *testing.T) {
	for _, alg := range []KeyAlgorithm{ECDSAP256, RSA2048} {
		t.Run(string(alg), func(t *testing.T) {
			ca := mustSelfSigned(t, alg)
			if !ca.SelfSigned() || len(ca.Chain()) != 0 {
				t.Fatal("a fresh root is not self-signed")
			}
			key, err := GenerateKey(alg)
			if err != nil {
				t.Fatal(err)
			}
			csrPEM, err := CreateCSR(key, spiffe.ID{TrustDomain: "x", Namespace: "a", ServiceAccount: "b"})
			if err != nil {
				t.Fatal(err)
			}
			csr, err := ParseCSR(csrPEM)
			if err != nil {
				t.Fatal(err)
			}
			leaf, err := ca.Issue(csr.PublicKey, LeafOptions{URIs: []*url.URL{workload.URL()}, TTL: time.Hour})
			if err != nil {
				t.Fatal(err)
			}
			if len(leaf.URIs) != 1 || leaf.URIs[0].String() != workload.String() || len(leaf.DNSNames) != 0 || leaf.IsCA {
				t.Fatalf("leaf SANs %v %v, IsCA %v", leaf.URIs, leaf.DNSNames, leaf.IsCA)
			}
			if got := time.Until(leaf.NotAfter); got > time.Hour || got < 59*time.Minute {
				t.Fatalf("leaf lifetime %s, want 1h", got)
			}
			for _, usage := range []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth} {
				if err := ca.Verify(leaf, nil, usage); err != nil {
					t.Fatal(err)
				}
			}
			// A leaf never outlives its CA.
			long, err := ca.Issue(csr.PublicKey, LeafOptions{URIs: []*url.URL{workload.URL()}, TTL: 1000 * time.Hour})
			if err != nil || !long.NotAfter.Equal(ca.Cert.NotAfter) {
				t.Fatalf("long TTL: NotAfter %v, CA's %v, %v", long.NotAfter, ca.Cert.NotAfter, err)
			}
			if _, err := ca.Issue(csr.PublicKey, LeafOptions{TTL: 0}); err == nil {
				t.Fatal("zero TTL accepted")
			}
		})
	}
}

func TestParseCSRRejects(t *testing.T) {
	key, _ := GenerateKey(ECDSAP256)
	good, err := CreateCSR(key, workload)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(good)
	tampered := append([]byte(nil), block.Bytes...)
	tampered[len(tampered)-5] ^= 0xff // inside the signature
	weak, _ := rsa.GenerateKey(rand.Reader, 1024)
	weakDER, _ := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, weak)
	for name, data := range map[string][]byte{
		"empty":         nil,
		"not PEM":       []byte("hello"),
		"certificate":   EncodeCerts(mustSelfSigned(t, ECDSAP256).Cert),
		"garbage DER":   pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: []byte{1, 2, 3}}),
		"bad signature": pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: tampered}),
		"trailing data": append(append([]byte(nil), good...), "junk"...),
		"RSA 1024 key":  pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: weakDER}),
	} {
		if _, err := ParseCSR(data); !errors.Is(err, ErrCSR) {
			t.Errorf("%s: err = %v, want ErrCSR", name, err)
		}
	}
}

func TestIstioLayoutRoundTrip(t *testing.T) {
	ca := mustSelfSigned(t, ECDSAP256)
	files, err := IstioLayout(ca)
	if err != nil {
		t.Fatal(err)
	}
	if string(files[CACertFile]) != string(files[RootCertFile]) || len(files[CertChainFile]) != 0 {
		t.Fatalf("self-signed layout: %q", files)
	}
	back, err := FromIstioLayout(files)
	if err != nil {
		t.Fatal(err)
	}
	if !back.Cert.Equal(ca.Cert) || !back.SelfSigned() {
		t.Fatal("round trip changed the root")
	}
	// istiod's own Secrets carry only ca-cert.pem and ca-key.pem in some versions.
	delete(files, RootCertFile)
	if _, err := FromIstioLayout(files); err != nil {
		t.Fatalf("self-signed without root-cert.pem: %v", err)
	}
}

// plugged returns a root and, in Istio's cacerts layout, an intermediate CA it signed.
func plugged(t testing.TB) (*Authority, map[string][]byte) {
	t.Helper()
	root := mustSelfSigned(t, ECDSAP256)
	key, _ := GenerateKey(ECDSAP256)
	inter, err := root.IssueCA(key.Public(), "plugged", 12*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, _ := EncodeKey(key)
	return root, map[string][]byte{
		CACertFile:    EncodeCerts(inter),
		CAKeyFile:     keyPEM,
		CertChainFile: EncodeCerts(inter, root.Cert),
		RootCertFile:  EncodeCerts(root.Cert),
	}
}

func TestPluggedIntermediate(t *testing.T) {
	root, files := plugged(t)
	ca, err := FromIstioLayout(files)
	if err != nil {
		t.Fatal(err)
	}
	if ca.SelfSigned() || len(ca.Chain()) != 1 || !ca.Roots[0].Equal(root.Cert) {
		t.Fatalf("chain %d certs, self-signed %v", len(ca.Chain()), ca.SelfSigned())
	}
	key, _ := GenerateKey(ECDSAP256)
	leaf, err := ca.Issue(key.Public(), LeafOptions{URIs: []*url.URL{workload.URL()}, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if err := root.Verify(leaf, ca.Chain(), x509.ExtKeyUsageClientAuth); err != nil {
		t.Fatalf("leaf does not verify to the plugged root through the chain: %v", err)
	}
	if err := root.Verify(leaf, nil, x509.ExtKeyUsageClientAuth); err == nil {
		t.Fatal("leaf verified without its intermediate")
	}
}

func TestFromIstioLayoutRejects(t *testing.T) {
	other := mustSelfSigned(t, ECDSAP256)
	otherKey, _ := EncodeKey(other.Key)
	leafKey, _ := GenerateKey(ECDSAP256)
	notCA, _ := other.Issue(leafKey.Public(), LeafOptions{DNSNames: []string{"x"}, TTL: time.Hour})
	leafKeyPEM, _ := EncodeKey(leafKey)
	for name, tc := range map[string]struct {
		edit func(map[string][]byte)
		want string
	}{
		"missing key":  {func(f map[string][]byte) { delete(f, CAKeyFile) }, "ca-key.pem is missing"},
		"missing cert": {func(f map[string][]byte) { f[CACertFile] = nil }, "ca-cert.pem is missing"},
		"corrupt cert": {func(f map[string][]byte) {
			f[CACertFile] = []byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
		}, "ca-cert.pem"},
		"corrupt key":         {func(f map[string][]byte) { f[CAKeyFile] = []byte("not a key") }, "ca-key.pem"},
		"corrupt root":        {func(f map[string][]byte) { f[RootCertFile] = []byte("junk") }, "root-cert.pem"},
		"key of another CA":   {func(f map[string][]byte) { f[CAKeyFile] = otherKey }, "does not match"},
		"foreign root":        {func(f map[string][]byte) { f[RootCertFile] = EncodeCerts(other.Cert) }, "does not chain"},
		"no root, not a root": {func(f map[string][]byte) { delete(f, RootCertFile) }, "root-cert.pem is missing"},
		"signing cert not CA": {func(f map[string][]byte) { f[CACertFile] = EncodeCerts(notCA); f[CAKeyFile] = leafKeyPEM }, "not a CA"},
	} {
		t.Run(name, func(t *testing.T) {
			_, files := plugged(t)
			tc.edit(files)
			_, err := FromIstioLayout(files)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !(errors.Is(err, ErrBundle) || errors.Is(err, ErrPEM)) {
				t.Fatalf("err = %v, want one containing %q", err, tc.want)
			}
		})
	}
}

func TestParseKeyFormats(t *testing.T) {
	ec, _ := GenerateKey(ECDSAP256)
	rs, _ := GenerateKey(RSA2048)
	ecDER, _ := x509.MarshalECPrivateKey(ec.(*ecdsa.PrivateKey))
	for name, data := range map[string][]byte{
		"pkcs8": must(EncodeKey(ec)),
		"sec1":  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: ecDER}),
		"pkcs1": pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(rs.(*rsa.PrivateKey))}),
	} {
		if _, err := ParseKey(data); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, err := ParseKey(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte{1}})); !errors.Is(err, ErrPEM) {
		t.Errorf("certificate as key: %v", err)
	}
}

func TestServingLeafSANs(t *testing.T) {
	ca := mustSelfSigned(t, ECDSAP256)
	key, _ := GenerateKey(ECDSAP256)
	c, err := ca.Issue(key.Public(), LeafOptions{DNSNames: []string{"istiod.istio-system.svc"}, IPs: []net.IP{net.IPv4(127, 0, 0, 1)}, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.VerifyHostname("127.0.0.1"); err != nil {
		t.Fatal(err)
	}
	if err := c.VerifyHostname("istiod.istio-system.svc"); err != nil {
		t.Fatal(err)
	}
}

func must(b []byte, err error) []byte {
	if err != nil {
		panic(err)
	}
	return b
}
