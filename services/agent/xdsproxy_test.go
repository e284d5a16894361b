package agent

import (
	"context"
	"crypto/tls"
	"net"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	networking "istio.io/api/networking/v1alpha3"

	ca "sailplane.dev/services/ca"
	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/grpcserver"
	"sailplane.dev/shared/pki"
	"sailplane.dev/shared/schema"
	"sailplane.dev/shared/workloadcert"
	"sailplane.dev/tools/testenv"
)

// TestXDSProxy: the local proxy's ADS streams (SotW and delta) reach the xDS server through the
// agent's socket, plaintext or over mTLS where the server sees the workload's certificate.
func TestXDSProxy(t *testing.T) {
	for _, overTLS := range []bool{false, true} {
		name := "plaintext"
		if overTLS {
			name = "mTLS"
		}
		t.Run(name, func(t *testing.T) {
			caDir := t.TempDir()
			c := startCA(t, ca.Config{CertDir: caDir})
			up := startXDSServer(t, testenv.CAFromFolder(t, caDir), overTLS)

			cfg := Config{
				Config:         workloadcert.Config{CAAddress: c.Addr(), RootCertFile: c.RootFile, ProvisionedCertDir: testenv.ProvisionCert(t, caDir, web)},
				XDSProxySocket: filepath.Join(t.TempDir(), "XDS"), XDSAddress: up.addr, XDSOverTLS: overTLS,
			}
			a := startAgent(t, cfg)
			conn := dialSDS(t, cfg.XDSProxySocket)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			ads := discoveryv3.NewAggregatedDiscoveryServiceClient(conn)

			askVirtualServices(ctx, t, ads)

			delta, err := ads.DeltaAggregatedResources(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := delta.Send(&discoveryv3.DeltaDiscoveryRequest{Node: envoyNode, TypeUrl: schema.VirtualService.TypeURL, ResourceNamesSubscribe: []string{"*"}}); err != nil {
				t.Fatal(err)
			}
			dresp, err := delta.Recv()
			if err != nil {
				t.Fatalf("delta through the proxy: %v", err)
			}
			if len(dresp.GetResources()) != 1 || dresp.GetResources()[0].GetName() != "demo/reviews" {
				t.Errorf("delta: %v, want demo/reviews", dresp.GetResources())
			}

			if overTLS {
				peers := up.peerIDs()
				if len(peers) != 2 {
					t.Fatalf("the xDS server saw %d streams, want 2", len(peers))
				}
				for _, p := range peers {
					if p != web.String() {
						t.Errorf("the xDS server saw %q, want the workload %s", p, web)
					}
				}
				if a.Current() == nil {
					t.Error("streams went up over mTLS before the agent had a certificate")
				}
			}
		})
	}
}

// An xDS server that refuses streams as overloaded (Unavailable with a retry delay): the agent
// opens the stream again after the delay and sends the proxy's request again; the proxy sees
// only the answer.
func TestXDSProxyRetriesWhenOverloaded(t *testing.T) {
	var streams atomic.Int32
	refuseTwice := grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if streams.Add(1) <= 2 {
			return grpcserver.Overloaded("test server: overloaded", 20*time.Millisecond)
		}
		return handler(srv, ss)
	})
	caDir := t.TempDir()
	c := startCA(t, ca.Config{CertDir: caDir})
	up := startXDSServer(t, testenv.CAFromFolder(t, caDir), false, refuseTwice)
	cfg := Config{
		Config:         workloadcert.Config{CAAddress: c.Addr(), RootCertFile: c.RootFile, ProvisionedCertDir: testenv.ProvisionCert(t, caDir, web)},
		XDSProxySocket: filepath.Join(t.TempDir(), "XDS"), XDSAddress: up.addr,
	}
	startAgent(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	askVirtualServices(ctx, t, discoveryv3.NewAggregatedDiscoveryServiceClient(dialSDS(t, cfg.XDSProxySocket)))
	if n := streams.Load(); n != 3 {
		t.Errorf("the server saw %d streams, want 3 (two refused)", n)
	}
}

// askVirtualServices asks for the VirtualServices over SotW through the agent's proxy: the
// answer must hold the one the server has.
func askVirtualServices(ctx context.Context, t *testing.T, ads discoveryv3.AggregatedDiscoveryServiceClient) {
	t.Helper()
	sotw, err := ads.StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := sotw.Send(&discoveryv3.DiscoveryRequest{Node: envoyNode, TypeUrl: schema.VirtualService.TypeURL}); err != nil {
		t.Fatal(err)
	}
	resp, err := sotw.Recv()
	if err != nil {
		t.Fatalf("SotW through the proxy: %v", err)
	}
	if len(resp.GetResources()) != 1 {
		t.Errorf("SotW: %d resources, want 1", len(resp.GetResources()))
	}
}

// xdsServer is a real ADS server (the bus serves the xDS protocol) holding one VirtualService;
// over TLS it requires a client certificate from the ca and records the caller's URI SAN.
type xdsServer struct {
	addr  string
	mu    sync.Mutex
	peers []string
}

func (s *xdsServer) peerIDs() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.peers...)
}

func startXDSServer(t *testing.T, auth *pki.Authority, overTLS bool, extra ...grpc.ServerOption) *xdsServer {
	t.Helper()
	store := bus.NewStore()
	if err := store.Upsert(schema.VirtualService.TypeURL, &bus.Resource{Name: "demo/reviews", Body: &networking.VirtualService{Hosts: []string{"reviews"}}}); err != nil {
		t.Fatal(err)
	}
	s := &xdsServer{}
	var opts []grpc.ServerOption
	if overTLS {
		key, err := pki.GenerateKey(pki.ECDSAP256)
		if err != nil {
			t.Fatal(err)
		}
		leaf, err := auth.Issue(key.Public(), pki.LeafOptions{IPs: []net.IP{net.IPv4(127, 0, 0, 1)}, TTL: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		opts = append(opts, grpc.Creds(credentials.NewTLS(&tls.Config{
			Certificates: []tls.Certificate{{Certificate: [][]byte{leaf.Raw}, PrivateKey: key}},
			ClientAuth:   tls.RequireAndVerifyClientCert, ClientCAs: auth.RootPool(),
		})), grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
			if p, ok := peer.FromContext(ss.Context()); ok {
				if info, ok := p.AuthInfo.(credentials.TLSInfo); ok && len(info.State.PeerCertificates[0].URIs) == 1 {
					s.mu.Lock()
					s.peers = append(s.peers, info.State.PeerCertificates[0].URIs[0].String())
					s.mu.Unlock()
				}
			}
			return handler(srv, ss)
		}))
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(append(opts, extra...)...)
	bus.NewServer(store).Register(gs)
	done := make(chan struct{})
	go func() { defer close(done); _ = gs.Serve(lis) }()
	t.Cleanup(func() { gs.Stop(); <-done })
	s.addr = lis.Addr().String()
	return s
}
