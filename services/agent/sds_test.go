package agent

import (
	"context"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/anypb"
)

const secretTypeURL = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret"

// sdsClient speaks Envoy's SDS over the agent's socket as Envoy does: plain gRPC and the
// generated service client, nothing of go-control-plane's server side. Each update it receives
// (secrets by name) goes to its channel; it ACKs every response.
type sdsClient struct {
	updates chan sdsUpdate
}

type sdsUpdate struct {
	secrets  map[string]*tlsv3.Secret
	received time.Time
}

func dialSDS(t *testing.T, socket string) *grpc.ClientConn {
	t.Helper()
	// Waiting for ready, as Envoy retries: the socket may not be listening yet.
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.WaitForReady(true)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

var envoyNode = &corev3.Node{Id: "sidecar~10.0.0.1~web-0.demo~demo.svc.cluster.local", Cluster: "web.demo"}

// streamSDS opens a state-of-the-world stream for names.
func streamSDS(t *testing.T, ctx context.Context, conn *grpc.ClientConn, names ...string) *sdsClient {
	t.Helper()
	stream, err := secretv3.NewSecretDiscoveryServiceClient(conn).StreamSecrets(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&discoveryv3.DiscoveryRequest{Node: envoyNode, TypeUrl: secretTypeURL, ResourceNames: names}); err != nil {
		t.Fatal(err)
	}
	return newSDSClient(t, func() ([]*anypb.Any, func() error, error) {
		resp, err := stream.Recv()
		ack := func() error {
			return stream.Send(&discoveryv3.DiscoveryRequest{
				TypeUrl: secretTypeURL, ResourceNames: names, VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce(),
			})
		}
		return resp.GetResources(), ack, err
	})
}

// deltaSDS opens a delta stream for names.
func deltaSDS(t *testing.T, ctx context.Context, conn *grpc.ClientConn, names ...string) *sdsClient {
	t.Helper()
	stream, err := secretv3.NewSecretDiscoveryServiceClient(conn).DeltaSecrets(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&discoveryv3.DeltaDiscoveryRequest{Node: envoyNode, TypeUrl: secretTypeURL, ResourceNamesSubscribe: names}); err != nil {
		t.Fatal(err)
	}
	return newSDSClient(t, func() ([]*anypb.Any, func() error, error) {
		resp, err := stream.Recv()
		var resources []*anypb.Any
		for _, r := range resp.GetResources() {
			resources = append(resources, r.GetResource())
		}
		ack := func() error {
			return stream.Send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: secretTypeURL, ResponseNonce: resp.GetNonce()})
		}
		return resources, ack, err
	})
}

// newSDSClient reads responses with next (their secrets, and how to ACK them) until the stream
// ends, passing each on as an update.
func newSDSClient(t *testing.T, next func() (resources []*anypb.Any, ack func() error, err error)) *sdsClient {
	c := &sdsClient{updates: make(chan sdsUpdate, 100)}
	go func() {
		defer close(c.updates)
		for {
			resources, ack, err := next()
			if err != nil {
				return
			}
			got := map[string]*tlsv3.Secret{}
			for _, r := range resources {
				s := &tlsv3.Secret{}
				if err := r.UnmarshalTo(s); err != nil {
					t.Errorf("SDS resource: %v", err)
					return
				}
				got[s.GetName()] = s
			}
			c.updates <- sdsUpdate{secrets: got, received: time.Now()}
			if err := ack(); err != nil {
				return
			}
		}
	}()
	return c
}

// next waits for the next update.
func (c *sdsClient) next(t *testing.T) sdsUpdate {
	t.Helper()
	select {
	case u, ok := <-c.updates:
		if !ok {
			t.Fatal("SDS stream ended")
		}
		return u
	case <-timeout():
		t.Fatal("no SDS update in 30s")
	}
	return sdsUpdate{}
}
