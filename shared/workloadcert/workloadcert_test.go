package workloadcert

import (
	"crypto/x509"
	"encoding/base64"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func b64(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }

func TestRenewAt(t *testing.T) {
	got := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name     string
		notAfter time.Duration
		jitter   float64
		want     time.Duration
	}{
		{"no jitter: 80%", 10 * time.Hour, 0, 8 * time.Hour},
		{"most jitter: 75%", 10 * time.Hour, 1, 7*time.Hour + 30*time.Minute},
		{"lifetime from receipt", 100 * time.Second, 0, 80 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			leaf := &x509.Certificate{NotBefore: got.Add(-2 * time.Minute), NotAfter: got.Add(tc.notAfter)}
			if at := RenewAt(leaf, got, tc.jitter); at.Sub(got) != tc.want {
				t.Errorf("renew after %s, want %s", at.Sub(got), tc.want)
			}
		})
	}
}

func TestTokenIdentity(t *testing.T) {
	jwt := func(payload string) string {
		return "eyJhbGciOiJSUzI1NiJ9." + b64(payload) + ".c2ln"
	}
	for _, tc := range []struct {
		name, token, want, err string
	}{
		{"service account", jwt(`{"sub":"system:serviceaccount:demo:web"}`), "spiffe://cluster.local/ns/demo/sa/web", ""},
		{"not a JWT", "abc", "", "not a JWT"},
		{"user token", jwt(`{"sub":"alice"}`), "", "system:serviceaccount"},
		{"bad payload", "a.!!.c", "", "JWT payload"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id, err := tokenIdentity(tc.token)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			id.TrustDomain = "cluster.local"
			if id.String() != tc.want {
				t.Errorf("identity %s, want %s", id, tc.want)
			}
		})
	}
}
