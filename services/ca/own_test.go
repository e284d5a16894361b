package ca

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"sailplane.dev/shared/pki"
	"sailplane.dev/shared/spiffe"
	"sailplane.dev/shared/testlog"
	"sailplane.dev/shared/workloadcert"
)

// TestServiceCertFolders: without Kubernetes, the ca keeps a bootstrap credential per control
// plane service; a service started on its folder gets its own certificate (its own key, its
// identity) over CreateCertificate, authenticated with the folder's, then renews with its own.
func TestServiceCertFolders(t *testing.T) {
	dir := t.TempDir()
	r := startCA(t, Config{CertDir: filepath.Join(dir, "root"), ServiceCertDir: filepath.Join(dir, "services")})
	folder := filepath.Join(dir, "services", "xds-server")
	// The folders are written one after the other: wait for the last.
	waitFor(t, func() error {
		for _, sa := range ServiceAccounts {
			for _, f := range []string{workloadcert.RootCertFile, workloadcert.CertChainFile} {
				if _, err := os.Stat(filepath.Join(dir, "services", sa, f)); err != nil {
					return fmt.Errorf("%s: %w", sa, err)
				}
			}
		}
		return nil
	})
	if fi, err := os.Stat(filepath.Join(folder, workloadcert.KeyFile)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v, mode %v, want 0600", err, fi.Mode())
	}
	provisioned, err := os.ReadFile(filepath.Join(folder, workloadcert.CertChainFile))
	if err != nil {
		t.Fatal(err)
	}

	client, err := workloadcert.New(workloadcert.Config{
		CAAddress: r.Addr().String(), RootCertFile: filepath.Join(folder, workloadcert.RootCertFile),
		ProvisionedCertDir: folder, CertTTL: 3 * time.Second,
	}, testlog.New(t, 0))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- client.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	select {
	case <-client.Ready():
	case <-time.After(30 * time.Second):
		t.Fatal("no certificate after 30s")
	}
	first := client.Current()
	want := spiffe.ID{TrustDomain: "cluster.local", Namespace: "istio-system", ServiceAccount: "xds-server"}
	if first.ID != want {
		t.Fatalf("identity %s, want %s", first.ID, want)
	}
	prov, err := pki.ParseCerts(provisioned)
	if err != nil {
		t.Fatal(err)
	}
	if pki.PublicKeysEqual(first.Leaf().PublicKey, prov[0].PublicKey) {
		t.Fatal("the service's certificate is for the provisioned key: want its own")
	}
	// xds-server's certificates carry istiod's names (it serves TLS xDS with them); others none.
	if names := first.Leaf().DNSNames; !slices.Contains(names, "istiod.istio-system.svc") {
		t.Errorf("xds-server's certificate names %v, want istiod.istio-system.svc among them", names)
	}
	ingestFolder := filepath.Join(dir, "services", "config-ingest")
	ingest, err := workloadcert.New(workloadcert.Config{
		CAAddress: r.Addr().String(), RootCertFile: filepath.Join(ingestFolder, workloadcert.RootCertFile), ProvisionedCertDir: ingestFolder,
	}, testlog.New(t, 0))
	if err != nil {
		t.Fatal(err)
	}
	ingestCert, err := ingest.Issue(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if ingestCert.ID.ServiceAccount != "config-ingest" || len(ingestCert.Leaf().DNSNames) != 0 {
		t.Errorf("config-ingest's certificate: %s, DNS names %v, want config-ingest's identity and no DNS name", ingestCert.ID, ingestCert.Leaf().DNSNames)
	}
	// The webhook's carry its Service's names, which the Kubernetes API server calls it by.
	hookFolder := filepath.Join(dir, "services", "webhook")
	hook, err := workloadcert.New(workloadcert.Config{
		CAAddress: r.Addr().String(), RootCertFile: filepath.Join(hookFolder, workloadcert.RootCertFile), ProvisionedCertDir: hookFolder,
	}, testlog.New(t, 0))
	if err != nil {
		t.Fatal(err)
	}
	hookCert, err := hook.Issue(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if names := hookCert.Leaf().DNSNames; !slices.Equal(names, []string{"sailplane-webhook.istio-system.svc", "sailplane-webhook.istio-system.svc.cluster.local"}) {
		t.Errorf("the webhook's certificate names %v, want its Service's", names)
	}
	// The provisioned folder is not needed again: the renewal (at 80 % of 3 s) authenticates
	// with the service's own certificate.
	for _, f := range []string{workloadcert.KeyFile, workloadcert.CertChainFile} {
		if err := os.Remove(filepath.Join(folder, f)); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, func() error {
		if client.Current() == first {
			return errors.New("not renewed yet")
		}
		return nil
	})
	if got := client.Current().ID; got != want {
		t.Errorf("renewed identity %s, want %s", got, want)
	}
}
