package framework

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"sailplane.dev/shared/pki"
)

const secretTypeURL = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret"

// SDSWatch is Envoy's side of an agent's SDS socket: one state-of-the-world stream asking for
// the workload certificate ("default"), each response ACKed, the latest certificate kept.
type SDSWatch struct {
	mu     sync.Mutex
	latest SDSCert
	err    error // why the stream ended
}

// SDSCert is a workload certificate an SDS stream received, and when.
type SDSCert struct {
	Leaf     *x509.Certificate
	Received time.Time
}

// WatchSDS opens an SDS stream on the agent socket until the test ends.
func WatchSDS(t testing.TB, socket string) *SDSWatch {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	w := &SDSWatch{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		err := w.watch(ctx, secretv3.NewSecretDiscoveryServiceClient(conn))
		w.mu.Lock()
		w.err = err
		w.mu.Unlock()
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		conn.Close()
	})
	return w
}

func (w *SDSWatch) watch(ctx context.Context, sds secretv3.SecretDiscoveryServiceClient) error {
	stream, err := sds.StreamSecrets(ctx)
	if err != nil {
		return err
	}
	req := &discoveryv3.DiscoveryRequest{TypeUrl: secretTypeURL, ResourceNames: []string{"default"},
		Node: &corev3.Node{Id: "sidecar~127.0.0.1~envoy.demo~demo.svc.cluster.local"}}
	for {
		if err := stream.Send(req); err != nil {
			return err
		}
		resp, err := stream.Recv()
		if err != nil {
			return err
		}
		for _, r := range resp.GetResources() {
			var s tlsv3.Secret
			if err := r.UnmarshalTo(&s); err != nil {
				return fmt.Errorf("SDS resource: %w", err)
			}
			if s.GetName() != "default" {
				continue
			}
			chain, err := pki.ParseCerts(s.GetTlsCertificate().GetCertificateChain().GetInlineBytes())
			if err == nil && len(chain) == 0 {
				err = errors.New("no certificate")
			}
			if err != nil {
				return fmt.Errorf("SDS secret default: %w", err)
			}
			w.mu.Lock()
			if !chain[0].Equal(w.latest.Leaf) {
				w.latest = SDSCert{Leaf: chain[0], Received: time.Now()}
			}
			w.mu.Unlock()
		}
		req = &discoveryv3.DiscoveryRequest{TypeUrl: secretTypeURL, ResourceNames: []string{"default"},
			VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()}
	}
}

// Latest is the workload certificate the stream last received (its Leaf nil before the first),
// and an error once the stream ended.
func (w *SDSWatch) Latest() (SDSCert, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.latest, w.err
}
