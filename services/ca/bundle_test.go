package ca

import (
	"strings"
	"testing"

	securityv1 "sailplane.dev/proto/security/v1"
	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/schema"
)

// TestTrustBundlePublished: once Ready, the bus holds the ca's trust bundle, named after its
// trust domain, with the roots the ca signs under; a restart on the same folder publishes the
// same roots.
func TestTrustBundlePublished(t *testing.T) {
	dir := t.TempDir()
	var first string
	for run := range 2 {
		store := bus.NewStore()
		svc, err := tryStartCAWith(t, Config{CertDir: dir, TrustDomain: "example.org"}, Deps{Publisher: store})
		if err != nil {
			t.Fatal(err)
		}
		r, ok := store.Get(schema.TrustBundle.TypeURL, "example.org")
		if !ok {
			t.Fatalf("run %d: no TrustBundle example.org on the bus", run)
		}
		b := r.Body.(*securityv1.TrustBundle)
		roots := strings.Join(b.GetRootCertificates(), "")
		if b.GetTrustDomain() != "example.org" || roots != string(svc.RootsPEM()) || len(b.GetRootCertificates()) != 1 {
			t.Fatalf("run %d: bundle %v, want example.org with the roots\n%s", run, b, svc.RootsPEM())
		}
		if run == 0 {
			first = roots
		} else if roots != first {
			t.Fatal("a restart published another root")
		}
		if err := svc.stop(); err != nil {
			t.Fatalf("Run: %v", err)
		}
	}
}
