package agent

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	ca "sailplane.dev/services/ca"
	"sailplane.dev/shared/grpcbootstrap"
	"sailplane.dev/shared/pki"
	"sailplane.dev/shared/spiffe"
	"sailplane.dev/shared/workloadcert"
	"sailplane.dev/tools/testenv"
)

func timeout() <-chan time.Time { return time.After(30 * time.Second) }

var web = spiffe.ID{TrustDomain: "cluster.local", Namespace: "demo", ServiceAccount: "web"}

// outputs is an agent config with every output on, in a temporary folder.
func outputs(t *testing.T, c *testCA) Config {
	dir := t.TempDir()
	return Config{
		Config:    workloadcert.Config{CAAddress: c.Addr(), RootCertFile: c.RootFile},
		SDSSocket: filepath.Join(dir, "sds.sock"), OutputDir: filepath.Join(dir, "creds"),
		GRPCBootstrap: filepath.Join(dir, "bootstrap.json"), XDSAddress: "127.0.0.1:15010",
		XDSProxySocket: filepath.Join(dir, "XDS"), EnvoyBootstrap: filepath.Join(dir, "envoy-rev.json"),
		Pod: "web-0", IP: "10.0.0.1", ReadinessAddr: "127.0.0.1:0",
	}
}

// provisionedAgent starts a ca with its root in a folder and returns it with an agent config with
// every output on, provisioned with a certificate for web (as a VM is).
func provisionedAgent(t *testing.T) (*testCA, Config) {
	caDir := t.TempDir()
	c := startCA(t, ca.Config{CertDir: caDir})
	cfg := outputs(t, c)
	cfg.ProvisionedCertDir = testenv.ProvisionCert(t, caDir, web)
	return c, cfg
}

// TestFirstCertificate: a workload provisioned with a certificate (a VM) gets its own for a key
// it generated, in files, a gRPC bootstrap and SDS, and turns ready; its key never leaves it.
func TestFirstCertificate(t *testing.T) {
	for _, alg := range []pki.KeyAlgorithm{pki.ECDSAP256, pki.RSA2048} {
		t.Run(string(alg), func(t *testing.T) {
			c, cfg := provisionedAgent(t)
			cfg.KeyAlgorithm = alg
			a := startAgent(t, cfg)
			cred := waitReady(t, a)
			checkCredential(t, cred, web, c.svc.RootsPEM())

			// The files: the key matches the certificate, the roots are the ca's.
			pair, err := tls.LoadX509KeyPair(filepath.Join(cfg.OutputDir, CertChainFile), filepath.Join(cfg.OutputDir, KeyFile))
			if err != nil {
				t.Fatalf("written key and certificate: %v", err)
			}
			if !bytes.Equal(pair.Leaf.Raw, cred.Leaf().Raw) {
				t.Error("cert-chain.pem is not the agent's certificate")
			}
			if got, _ := os.ReadFile(filepath.Join(cfg.OutputDir, RootCertFile)); !bytes.Equal(got, c.svc.RootsPEM()) {
				t.Error("root-cert.pem is not the ca's roots")
			}
			if fi, err := os.Stat(filepath.Join(cfg.OutputDir, KeyFile)); err != nil || fi.Mode().Perm() != 0o600 {
				t.Errorf("key.pem: %v, mode %v; want 0600", err, fi.Mode().Perm())
			}
			if _, isRSA := cred.Key.Public().(interface{ Size() int }); isRSA != (alg == pki.RSA2048) {
				t.Errorf("key %T for %s", cred.Key, alg)
			}

			// What went to the ca: CSRs, for the key the certificate is for, never a private key.
			reqs := a.sent()
			checkNoKeySent(t, reqs)
			csr, err := pki.ParseCSR([]byte(reqs[len(reqs)-1].GetCsr()))
			if err != nil {
				t.Fatal(err)
			}
			if !pki.PublicKeysEqual(csr.PublicKey, cred.Leaf().PublicKey) {
				t.Error("the certificate is not for the CSR's key")
			}

			checkBootstrap(t, cfg)
			eb := readEnvoyBootstrap(t, cfg.EnvoyBootstrap)
			if want := "sidecar~10.0.0.1~web-0.demo~demo.svc.cluster.local"; eb.GetNode().GetId() != want {
				t.Errorf("Envoy node %q, want %q", eb.GetNode().GetId(), want)
			}
			for _, c := range eb.GetStaticResources().GetClusters() {
				path := c.GetLoadAssignment().GetEndpoints()[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetPipe().GetPath()
				if want := map[string]string{xdsCluster: cfg.XDSProxySocket, sdsCluster: cfg.SDSSocket}[c.GetName()]; path != want {
					t.Errorf("Envoy cluster %s reaches %q, want %q", c.GetName(), path, want)
				}
			}

			// SDS serves both secrets.
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			got := streamSDS(t, ctx, dialSDS(t, cfg.SDSSocket), WorkloadSecret, RootSecret).next(t).secrets
			if chain := got[WorkloadSecret].GetTlsCertificate().GetCertificateChain().GetInlineBytes(); !bytes.Equal(chain, cred.ChainPEM) {
				t.Errorf("SDS default chain = %q", chain)
			}
			if key := got[WorkloadSecret].GetTlsCertificate().GetPrivateKey().GetInlineBytes(); !bytes.Equal(key, cred.KeyPEM) {
				t.Error("SDS default key is not the agent's")
			}
			if roots := got[RootSecret].GetValidationContext().GetTrustedCa().GetInlineBytes(); !bytes.Equal(roots, c.svc.RootsPEM()) {
				t.Errorf("SDS ROOTCA = %q", roots)
			}

			if code := readiness(t, a); code != http.StatusOK {
				t.Errorf("readiness %d with a certificate, want 200", code)
			}
		})
	}
}

func checkBootstrap(t *testing.T, cfg Config) {
	t.Helper()
	data, err := os.ReadFile(cfg.GRPCBootstrap)
	if err != nil {
		t.Fatal(err)
	}
	var b struct {
		XDSServers []struct {
			ServerURI    string `json:"server_uri"`
			ChannelCreds []struct {
				Type string `json:"type"`
			} `json:"channel_creds"`
		} `json:"xds_servers"`
		Node struct {
			ID       string            `json:"id"`
			Metadata map[string]any    `json:"metadata"`
			Locality map[string]string `json:"locality"`
		} `json:"node"`
		CertificateProviders map[string]struct {
			PluginName string                    `json:"plugin_name"`
			Config     grpcbootstrap.FileWatcher `json:"config"`
		} `json:"certificate_providers"`
	}
	if err := json.Unmarshal(data, &b); err != nil {
		t.Fatalf("bootstrap: %v\n%s", err, data)
	}
	if len(b.XDSServers) != 1 || b.XDSServers[0].ServerURI != cfg.XDSAddress || b.XDSServers[0].ChannelCreds[0].Type != "insecure" {
		t.Errorf("xds_servers = %+v", b.XDSServers)
	}
	if want := "sidecar~10.0.0.1~web-0.demo~demo.svc.cluster.local"; b.Node.ID != want {
		t.Errorf("node.id = %q, want %q", b.Node.ID, want)
	}
	if b.Node.Metadata["GENERATOR"] != "grpc" || b.Node.Metadata["SERVICE_ACCOUNT"] != "web" || b.Node.Metadata["NAMESPACE"] != "demo" || b.Node.Locality == nil {
		t.Errorf("node = %+v", b.Node)
	}
	p, ok := b.CertificateProviders["default"]
	if !ok || p.PluginName != "file_watcher" {
		t.Fatalf("certificate_providers = %+v", b.CertificateProviders)
	}
	for file, name := range map[string]string{p.Config.CertificateFile: CertChainFile, p.Config.PrivateKeyFile: KeyFile, p.Config.CACertificateFile: RootCertFile} {
		abs, _ := filepath.Abs(filepath.Join(cfg.OutputDir, name))
		if file != abs {
			t.Errorf("file_watcher names %q, want %q", file, abs)
		}
	}
}

func readiness(t *testing.T, a *runningAgent) int {
	t.Helper()
	var addr string
	eventually(t, "the readiness listener", func() bool {
		if ra := a.ReadinessAddr(); ra != nil {
			addr = ra.String()
		}
		return addr != ""
	})
	resp, err := http.Get("http://" + addr + ReadyPath)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestRotation: with a certificate of a few seconds the agent renews it before expiry, with a
// new key, rewriting the files and pushing it over SDS (state of the world and delta).
func TestRotation(t *testing.T) {
	c, cfg := provisionedAgent(t)
	cfg.CertTTL = 3 * time.Second
	a := startAgent(t, cfg)
	first := waitReady(t, a)
	if life := first.Leaf().NotAfter.Sub(first.Received); life > 4*time.Second {
		t.Fatalf("certificate lives %s, asked for 3s", life)
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	conn := dialSDS(t, cfg.SDSSocket)
	sotw := streamSDS(t, ctx, conn, WorkloadSecret, RootSecret)
	delta := deltaSDS(t, ctx, conn, WorkloadSecret, RootSecret)

	// Each stream sees at least two later certificates, each valid when pushed.
	for name, s := range map[string]*sdsClient{"sotw": sotw, "delta": delta} {
		seen := map[string]bool{}
		for len(seen) < 3 {
			u := s.next(t)
			d, ok := u.secrets[WorkloadSecret]
			if !ok {
				continue
			}
			pair, err := tls.X509KeyPair(d.GetTlsCertificate().GetCertificateChain().GetInlineBytes(), d.GetTlsCertificate().GetPrivateKey().GetInlineBytes())
			if err != nil {
				t.Fatalf("%s: pushed key and certificate: %v", name, err)
			}
			if u.received.After(pair.Leaf.NotAfter) {
				t.Errorf("%s: pushed an expired certificate", name)
			}
			seen[pair.Leaf.SerialNumber.String()] = true
		}
	}
	now := a.Current()
	if now.Leaf().SerialNumber.Cmp(first.Leaf().SerialNumber) == 0 || pki.PublicKeysEqual(now.Key.Public(), first.Key.Public()) {
		t.Error("rotation kept the certificate or the key")
	}
	checkCredential(t, now, web, c.svc.RootsPEM())
	// Files follow: the written certificate is a renewed one.
	eventually(t, "cert-chain.pem rewritten", func() bool {
		pair, err := tls.LoadX509KeyPair(filepath.Join(cfg.OutputDir, CertChainFile), filepath.Join(cfg.OutputDir, KeyFile))
		return err == nil && pair.Leaf.SerialNumber.Cmp(first.Leaf().SerialNumber) != 0
	})
	checkNoKeySent(t, a.sent())
}

// TestCAOutage: an agent started before the ca is not ready and retries; once served, the ca
// stopping costs nothing: the agent keeps its certificate while it retries, and renews once the
// ca is back.
func TestCAOutage(t *testing.T) {
	c, cfg := provisionedAgent(t)
	cfg.CertTTL = 4 * time.Second
	c.stop()

	a := startAgent(t, cfg)
	eventually(t, "failed requests while the ca is down", func() bool { return a.failed() >= 2 })
	if code := readiness(t, a); code != http.StatusServiceUnavailable {
		t.Errorf("readiness %d without a certificate, want 503", code)
	}
	if w := a.warned(); len(w) != 1 {
		t.Errorf("the outage before the first certificate was logged %d times, want once: %q", len(w), w)
	}
	c = c.restart(t)
	held := waitReady(t, a)
	if code := readiness(t, a); code != http.StatusOK {
		t.Errorf("readiness %d with a certificate, want 200", code)
	}

	c.stop()
	failedBefore := a.failed()
	// Past the renewal time with the ca down: requests fail, the certificate stays.
	eventually(t, "renewal attempts with the ca down", func() bool { return a.failed() >= failedBefore+3 })
	if a.Current() != held {
		t.Fatal("the certificate changed while the ca was down")
	}
	if pair, err := tls.LoadX509KeyPair(filepath.Join(cfg.OutputDir, CertChainFile), filepath.Join(cfg.OutputDir, KeyFile)); err != nil || !bytes.Equal(pair.Leaf.Raw, held.Leaf().Raw) {
		t.Fatalf("files changed while the ca was down: %v", err)
	}
	if code := readiness(t, a); code != http.StatusOK {
		t.Errorf("readiness %d during the outage, want 200 (the certificate is held)", code)
	}

	if w := a.warned(); len(w) != 2 {
		t.Errorf("two outages logged %d times, want twice: %q", len(w), w)
	}

	c = c.restart(t)
	eventually(t, "renewal after the ca is back", func() bool { return a.Current() != held })
	checkCredential(t, a.Current(), web, c.svc.RootsPEM())
}

// TestRenewWithCertificate: once it holds a certificate the agent renews with it, so the
// provisioned one (or a token) is no longer needed.
func TestRenewWithCertificate(t *testing.T) {
	c, cfg := provisionedAgent(t)
	cfg.CertTTL = 3 * time.Second
	a := startAgent(t, cfg)
	first := waitReady(t, a)
	if err := os.RemoveAll(cfg.ProvisionedCertDir); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a renewal without the provisioned certificate", func() bool { return a.Current() != first })
	checkCredential(t, a.Current(), web, c.svc.RootsPEM())
}

// TestRenewTime: with files, the renewal leaves gRPC two refresh intervals to re-read them.
func TestRenewTime(t *testing.T) {
	got := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name             string
		life, refresh    time.Duration
		files            bool
		wantAfterGetting time.Duration
	}{
		{"no files: 80%", 10 * time.Second, 5 * time.Second, false, 8 * time.Second},
		{"refresh well within the last 20%", 24 * time.Hour, 15 * time.Minute, true, 19*time.Hour + 12*time.Minute},
		{"two refreshes longer than the last 20%", 10 * time.Second, 1500 * time.Millisecond, true, 7 * time.Second},
		{"two refreshes longer than half the life", 10 * time.Second, 3 * time.Second, true, 5 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := &Agent{cfg: Config{FileRefresh: tc.refresh}}
			if tc.files {
				a.cfg.OutputDir = "out"
			}
			c := &Credential{Chain: []*x509.Certificate{{NotAfter: got.Add(tc.life)}}, Received: got}
			if at := a.renewTime(c, 0); at.Sub(got) != tc.wantAfterGetting {
				t.Errorf("renew after %s, want %s", at.Sub(got), tc.wantAfterGetting)
			}
		})
	}
}

func TestNewRejects(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		err  string
	}{
		{"no root", Config{Config: workloadcert.Config{TokenFile: "t"}}, "root certificate"},
		{"no credential", Config{Config: workloadcert.Config{RootCertFile: "r"}}, "token file or a provisioned"},
		{"bootstrap without files", Config{Config: workloadcert.Config{RootCertFile: "r", TokenFile: "t"}, GRPCBootstrap: "b"}, "output folder"},
		{"key algorithm", Config{Config: workloadcert.Config{RootCertFile: "r", TokenFile: "t", KeyAlgorithm: "DSA"}}, `"DSA"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := New(tc.cfg, Deps{}); err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("error %v, want one containing %q", err, tc.err)
			}
		})
	}
}

// TestRestartWithOwnCertificate: with the provisioned folder set to the output folder (Istio's
// VM setup), a restarted agent authenticates with the certificate it last wrote.
func TestRestartWithOwnCertificate(t *testing.T) {
	c, cfg := provisionedAgent(t)
	first := startAgent(t, cfg)
	waitReady(t, first)
	first.stop()

	cfg.ProvisionedCertDir = cfg.OutputDir
	second := startAgent(t, cfg)
	checkCredential(t, waitReady(t, second), web, c.svc.RootsPEM())
}

// TestRootRotationFollowed: an agent whose root file still holds only the old root (a copy made
// before the rotation) keeps renewing after the ca switches to the new root, because it also
// trusts the bundle of its last answer, which carried the new root before the switch.
func TestRootRotationFollowed(t *testing.T) {
	c, cfg := provisionedAgent(t)
	cfg.CertTTL = 2 * time.Second
	a := startAgent(t, cfg)
	waitReady(t, a)
	oldRoots, err := pki.ParseCerts(c.svc.RootsPEM())
	if err != nil || len(oldRoots) != 1 {
		t.Fatalf("roots before the rotation: %v", err)
	}
	c.stop()

	rotating := c.cfg
	rotating.Listen = c.Addr()
	rotating.RotateRootBefore = time.Now().Truncate(time.Second).Add(time.Second) // roots are dated to the second
	rotating.RootRotationGrace = 3 * time.Second
	startCA(t, rotating) // cfg.RootCertFile keeps the old root only
	eventually(t, "a certificate signed by the new root", func() bool {
		cur := a.Current()
		return cur.Leaf().CheckSignatureFrom(oldRoots[0]) != nil && len(cur.Roots) > 0
	})
	if got, _ := os.ReadFile(cfg.RootCertFile); !bytes.Equal(got, pki.EncodeCerts(oldRoots...)) {
		t.Fatal("the test's root file changed: it must hold the old root only")
	}
}
