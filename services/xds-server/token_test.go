package xdsserver

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"sailplane.dev/shared/kube"
	"sailplane.dev/shared/testlog"
	"sailplane.dev/tools/testenv"
)

// tokenEnv is a real API server that issues service-account tokens (TokenRequest) and reviews
// them (TokenReview), counting the reviews.
type tokenEnv struct {
	client  kubernetes.Interface
	reviews atomic.Int64
	// reviewer is what the server under test reviews tokens with.
	reviewer *kube.TokenReviewer
}

func newTokenEnv(t testing.TB) *tokenEnv {
	t.Helper()
	k := testenv.KubeForTest(t)
	c, err := kubernetes.NewForConfig(k.RestConfig())
	if err != nil {
		t.Fatal(err)
	}
	e := &tokenEnv{client: c}
	counted := rest.CopyConfig(k.RestConfig())
	counted.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(req *http.Request) (*http.Response, error) {
			if strings.HasSuffix(req.URL.Path, "/tokenreviews") {
				e.reviews.Add(1)
			}
			return rt.RoundTrip(req)
		})
	})
	rc, err := kubernetes.NewForConfig(counted)
	if err != nil {
		t.Fatal(err)
	}
	e.reviewer = kube.NewTokenReviewer(rc, kube.TokenReviewOptions{})
	return e
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// token creates the ServiceAccount ns/sa (and its namespace) if needed and returns a token of it
// for the audiences (none: the API server's own).
func (e *tokenEnv) token(t testing.TB, ns, sa string, audiences ...string) string {
	t.Helper()
	ctx := context.Background()
	if _, err := e.client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil && !strings.Contains(err.Error(), "already exists") {
		t.Fatal(err)
	}
	if _, err := e.client.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil && !strings.Contains(err.Error(), "already exists") {
		t.Fatal(err)
	}
	tr, err := e.client.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authnv1.TokenRequest{
		Spec: authnv1.TokenRequestSpec{Audiences: audiences},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tr.Status.Token
}

// bearer is per-RPC credentials sending "authorization: Bearer <token>", and metadata md, as
// pilot-agent sends its istio-token and ClusterID.
type bearer struct {
	token string
	md    map[string]string
}

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	m := map[string]string{"authorization": "Bearer " + b.token}
	for k, v := range b.md {
		m[k] = v
	}
	return m, nil
}

func (bearer) RequireTransportSecurity() bool { return true }

// syncedLog is a log destination safe for the server's goroutines.
type syncedLog struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *syncedLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *syncedLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// TestTokenAuthentication: on the TLS port, a client without a certificate is served when its
// service-account token (audience istio-ca) passes TokenReview, as istiod serves pilot-agent,
// and held to the token's namespace and service account; a token for another audience, a
// garbage token, another cluster's claim, or no credential at all is Unauthenticated. The
// verdict is cached: many streams with one token cost one TokenReview. The token is never
// logged.
func TestTokenAuthentication(t *testing.T) {
	env := newTokenEnv(t)
	logs := &syncedLog{}
	srv, mesh := secureServer(t, func(_ *Config, d *Deps) {
		d.Tokens = env.reviewer
		d.Logger = slog.New(slog.NewTextHandler(logs, nil))
	})
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(logs.String())
		}
	})
	web := env.token(t, "demo", "web", "istio-ca")
	vault := env.token(t, "demo", "web", "vault")
	apiAudience := env.token(t, "demo", "web")
	admin := env.token(t, "istio-system", "istiod", "istio-ca")

	tlsOnly := &tls.Config{RootCAs: mesh.RootPool(), ServerName: "istiod.istio-system.svc"}
	// A certificate of a root the mesh does not trust: istiod then tries the token.
	foreignRoot, _ := servingCert(t)
	foreign := tlsOnly.Clone()
	foreign.Certificates = []tls.Certificate{issueFor(t, foreignRoot, "demo", "web")}
	node := func(ns, sa string) *corev3.Node {
		n := &corev3.Node{Id: "sidecar~198.18.0.1~web-1." + ns + "~" + ns + ".svc.cluster.local"}
		if sa != "" {
			n.Metadata = &structpb.Struct{Fields: map[string]*structpb.Value{"SERVICE_ACCOUNT": structpb.NewStringValue(sa)}}
		}
		return n
	}
	for _, tc := range []struct {
		name     string
		tls      *tls.Config // tlsOnly when nil
		token    string
		md       map[string]string
		req      *discoverygrpc.DiscoveryRequest
		want     codes.Code
		contains string
	}{
		{"token of the claimed account", nil, web, nil, clusters(node("demo", "web")), codes.OK, ""},
		{"token, no service account claimed", nil, web, nil, clusters(node("demo", "")), codes.OK, ""},
		{"token, this cluster claimed", nil, web, map[string]string{"ClusterID": "Kubernetes"}, clusters(node("demo", "web")), codes.OK, ""},
		{"token, another namespace claimed", nil, web, nil, clusters(node("payments", "web")), codes.PermissionDenied, `claims namespace "payments", but authenticated as spiffe://cluster.local/ns/demo/sa/web`},
		{"token, another service account claimed", nil, web, nil, clusters(node("demo", "admin")), codes.PermissionDenied, `claims service account "admin"`},
		{"token for another audience", nil, vault, nil, clusters(node("demo", "web")), codes.Unauthenticated, "token refused"},
		{"token of the API server's audience", nil, apiAudience, nil, clusters(node("demo", "web")), codes.Unauthenticated, "token refused"},
		{"garbage token", nil, "not-a-jwt", nil, clusters(node("demo", "web")), codes.Unauthenticated, "token refused"},
		{"token, another cluster claimed", nil, web, map[string]string{"ClusterID": "east"}, clusters(node("demo", "web")), codes.Unauthenticated, `claims cluster "east"`},
		{"no credential", nil, "", nil, clusters(node("demo", "web")), codes.Unauthenticated, "neither a client certificate nor an authorization: Bearer token"},
		{"untrusted certificate and a token", foreign, web, nil, clusters(node("demo", "web")), codes.OK, ""},
		{"untrusted certificate alone", foreign, "", nil, clusters(node("demo", "web")), codes.Unauthenticated, "client certificate not verified by the mesh's trust bundle"},
		{"debug types, token of the control plane's namespace", nil, admin, nil,
			&discoverygrpc.DiscoveryRequest{TypeUrl: typeSyncz, Node: node("istio-system", "")}, codes.OK, ""},
		{"debug types, token of another namespace", nil, web, nil,
			&discoverygrpc.DiscoveryRequest{TypeUrl: typeSyncz, Node: node("demo", "")}, codes.PermissionDenied, "may not read debug types"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tlsOnly
			if tc.tls != nil {
				cfg = tc.tls
			}
			opts := []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(cfg))}
			if tc.token != "" {
				opts = append(opts, grpc.WithPerRPCCredentials(bearer{tc.token, tc.md}))
			}
			for _, delta := range []bool{false, true} {
				err := firstAnswer(t, srv.SecureAddr().String(), delta, tc.req, opts...)
				if got := status.Code(err); got != tc.want || !strings.Contains(status.Convert(err).Message(), tc.contains) {
					t.Errorf("delta=%v: %v, want %v containing %q", delta, err, tc.want, tc.contains)
				}
			}
		})
	}

	// The certificate still authenticates, without a token.
	withCert := tlsOnly.Clone()
	withCert.Certificates = []tls.Certificate{issueFor(t, mesh, "demo", "web")}
	if err := firstAnswer(t, srv.SecureAddr().String(), false, clusters(node("demo", "web")), grpc.WithTransportCredentials(credentials.NewTLS(withCert))); err != nil {
		t.Errorf("certificate: %v", err)
	}
	// Plaintext (loopback) asks for nothing, as istiod's 15010.
	if err := firstAnswer(t, srv.Addr().String(), false, clusters(node("payments", "admin")), grpc.WithTransportCredentials(insecure.NewCredentials())); err != nil {
		t.Errorf("plaintext: %v", err)
	}

	// One TokenReview per token while its verdict is fresh, however many streams it opens.
	before := env.reviews.Load()
	fresh := env.token(t, "demo", "web", "istio-ca")
	var wg sync.WaitGroup
	for range 10 {
		wg.Go(func() {
			if err := firstAnswer(t, srv.SecureAddr().String(), false, clusters(node("demo", "web")),
				grpc.WithTransportCredentials(credentials.NewTLS(tlsOnly)), grpc.WithPerRPCCredentials(bearer{token: fresh})); err != nil {
				t.Errorf("stream with a cached verdict: %v", err)
			}
		})
	}
	wg.Wait()
	if n := env.reviews.Load() - before; n != 1 {
		t.Errorf("%d TokenReviews for 10 streams with one token, want 1", n)
	}

	out := logs.String()
	for _, tok := range []string{web, vault, fresh, admin} {
		if strings.Contains(out, tok) {
			t.Fatal("a token was logged")
		}
	}
	for _, want := range []string{`msg="xDS client refused"`, "token-sha256=" + kube.TokenFingerprint(vault), `msg="proxy refused"`} {
		if !strings.Contains(out, want) {
			t.Errorf("logs lack %s", want)
		}
	}
}

// firstAnswer opens an ADS stream (delta or state of the world) with opts, sends req and waits
// for the first response; the error is the stream's.
func firstAnswer(t *testing.T, addr string, delta bool, req *discoverygrpc.DiscoveryRequest, opts ...grpc.DialOption) error {
	t.Helper()
	conn, err := grpc.NewClient(addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	return firstAnswerOn(streamContext(t), conn, delta, req)
}

func firstAnswerOn(ctx context.Context, conn *grpc.ClientConn, delta bool, req *discoverygrpc.DiscoveryRequest) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ads := discoverygrpc.NewAggregatedDiscoveryServiceClient(conn)
	if delta {
		stream, err := ads.DeltaAggregatedResources(ctx)
		if err != nil {
			return err
		}
		// A Send failing with io.EOF means the server ended the stream: Recv has its status.
		if err := stream.Send(&discoverygrpc.DeltaDiscoveryRequest{TypeUrl: req.TypeUrl, Node: req.Node, ResourceNamesSubscribe: req.ResourceNames}); err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		_, err = stream.Recv()
		return err
	}
	stream, err := ads.StreamAggregatedResources(ctx)
	if err != nil {
		return err
	}
	if err := stream.Send(req); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	_, err = stream.Recv()
	return err
}

// BenchmarkStreamStart: what an ADS stream costs to open and answer its first request (CDS, an
// empty mesh) on an open connection, over plaintext (no authentication), over TLS with a client
// certificate, and over TLS with a token whose verdict is cached (no TokenReview in the loop).
func BenchmarkStreamStart(b *testing.B) {
	env := newTokenEnv(b)
	srv, mesh := secureServer(b, func(_ *Config, d *Deps) {
		d.Tokens = env.reviewer
		d.Logger = testlog.New(b, slog.LevelWarn)
	})
	token := env.token(b, "demo", "web", "istio-ca")
	tlsOnly := &tls.Config{RootCAs: mesh.RootPool(), ServerName: "istiod.istio-system.svc"}
	withCert := tlsOnly.Clone()
	withCert.Certificates = []tls.Certificate{issueFor(b, mesh, "demo", "web")}
	req := &discoverygrpc.DiscoveryRequest{TypeUrl: resourcev3.ClusterType, Node: &corev3.Node{Id: "sidecar~198.18.0.1~web-1.demo~demo.svc.cluster.local"}}
	for _, bc := range []struct {
		name string
		addr string
		opts []grpc.DialOption
	}{
		{"plaintext", srv.Addr().String(), []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}},
		{"certificate", srv.SecureAddr().String(), []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(withCert))}},
		{"token-cached", srv.SecureAddr().String(), []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(tlsOnly)), grpc.WithPerRPCCredentials(bearer{token: token})}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			conn, err := grpc.NewClient(bc.addr, bc.opts...)
			if err != nil {
				b.Fatal(err)
			}
			defer conn.Close()
			if err := firstAnswerOn(context.Background(), conn, false, req); err != nil { // connects, caches the verdict
				b.Fatal(err)
			}
			b.ResetTimer()
			for b.Loop() {
				if err := firstAnswerOn(context.Background(), conn, false, req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkAuthenticate: the authenticator alone for a TLS stream, with a token whose verdict
// is cached, and with a client certificate (verified against the trust bundle each time).
func BenchmarkAuthenticate(b *testing.B) {
	env := newTokenEnv(b)
	srv, mesh := secureServer(b, func(_ *Config, d *Deps) {
		d.Tokens = env.reviewer
		d.Logger = testlog.New(b, slog.LevelWarn)
	})
	token := env.token(b, "demo", "web", "istio-ca")
	ads := methodStream("/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources")
	withToken := metadata.NewIncomingContext(grpc.NewContextWithServerTransportStream(tlsPeer(), ads),
		metadata.Pairs("authorization", "Bearer "+token, "clusterid", "Kubernetes"))
	withCert := grpc.NewContextWithServerTransportStream(tlsPeer(issueFor(b, mesh, "demo", "web")), ads)
	for _, bc := range []struct {
		name string
		ctx  context.Context
	}{{"token-cached", withToken}, {"certificate", withCert}} {
		b.Run(bc.name, func(b *testing.B) {
			if _, err := srv.authenticate(bc.ctx); err != nil { // the first review, cached
				b.Fatal(err)
			}
			for b.Loop() {
				if _, err := srv.authenticate(bc.ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// methodStream is a grpc.ServerTransportStream naming only its method.
type methodStream string

func (m methodStream) Method() string             { return string(m) }
func (methodStream) SetHeader(metadata.MD) error  { return nil }
func (methodStream) SendHeader(metadata.MD) error { return nil }
func (methodStream) SetTrailer(metadata.MD) error { return nil }
