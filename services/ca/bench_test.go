package ca

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	pb "istio.io/api/security/v1alpha1"
	"k8s.io/client-go/rest"

	"sailplane.dev/shared/pki"
	"sailplane.dev/shared/spiffe"
)

// BenchmarkCreateCertificate measures signing throughput and latency of 100 concurrent
// clients, each on its own TLS connection sending CSRs for its own identity; the root, the
// serving and the workload keys are all of the named algorithm. "cert" clients authenticate
// with a certificate the ca issued; "token" clients with a service-account token the real API
// server issued and reviews (once per token: the review is cached). "token-uncached" clients
// send a distinct token with every request, all of one service account, so every request costs
// a TokenReview on the real API server, through the ca's own client (its default rate limit).
//
//	go test -run '^$' -bench CreateCertificate -benchtime 3000x ./services/ca/
func BenchmarkCreateCertificate(b *testing.B) {
	parent := b
	var env *kubeEnv // started once, for the whole benchmark
	for _, alg := range []pki.KeyAlgorithm{pki.ECDSAP256, pki.RSA2048} {
		b.Run(string(alg)+"/cert", func(b *testing.B) {
			dir := b.TempDir()
			r := startCA(b, Config{CertDir: dir, KeyAlgorithm: alg})
			benchSigning(b, alg, func(i int) (pb.IstioCertificateServiceClient, func(int) context.Context, spiffe.ID) {
				id := spiffe.ID{TrustDomain: "cluster.local", Namespace: "bench", ServiceAccount: fmt.Sprintf("sa-%d", i)}
				return r.client(b, r.RootsPEM(), issueClient(b, dir, id, alg)), background, id
			})
		})
		b.Run(string(alg)+"/token", func(b *testing.B) {
			if env == nil {
				env = newKubeEnv(parent)
			}
			ns := fmt.Sprintf("bench-%d", time.Now().UnixNano())
			env.namespace(b, ns)
			r := startCA(b, Config{Kube: env.cfg, Namespace: ns, KeyAlgorithm: alg})
			benchSigning(b, alg, func(i int) (pb.IstioCertificateServiceClient, func(int) context.Context, spiffe.ID) {
				id := spiffe.ID{TrustDomain: "cluster.local", Namespace: ns, ServiceAccount: fmt.Sprintf("sa-%d", i)}
				ctx := withToken(context.Background(), env.token(b, ns, id.ServiceAccount, "istio-ca"))
				return r.client(b, r.RootsPEM(), nil), func(int) context.Context { return ctx }, id
			})
		})
		b.Run(string(alg)+"/token-uncached", func(b *testing.B) {
			if env == nil {
				env = newKubeEnv(parent)
			}
			ns := fmt.Sprintf("bench-%d", time.Now().UnixNano())
			env.namespace(b, ns)
			id := spiffe.ID{TrustDomain: "cluster.local", Namespace: ns, ServiceAccount: "storm"}
			// Minted before the clock starts: one per call, and one per client's first call.
			tokens := env.tokens(b, ns, id.ServiceAccount, b.N+benchClients)
			// The ca's client as in production: the test environment's raised limit removed.
			kubeCfg := rest.CopyConfig(env.cfg)
			kubeCfg.QPS, kubeCfg.Burst = 0, 0
			r := startCA(b, Config{Kube: kubeCfg, Namespace: ns, KeyAlgorithm: alg})
			benchSigning(b, alg, func(i int) (pb.IstioCertificateServiceClient, func(int) context.Context, spiffe.ID) {
				return r.client(b, r.RootsPEM(), nil), func(call int) context.Context {
					if call < 0 { // the client's first call
						return withToken(context.Background(), tokens[b.N+i])
					}
					return withToken(context.Background(), tokens[call])
				}, id
			})
		})
	}
}

// benchClients is how many clients sign concurrently.
const benchClients = 100

func background(int) context.Context { return context.Background() }

// benchSigning runs b.N CreateCertificate calls over benchClients clients made by connect, which
// also gives the context (credentials) of each call: numbered from 0 to b.N-1 across clients,
// -1 for a client's first call, made before the clock starts.
func benchSigning(b *testing.B, alg pki.KeyAlgorithm, connect func(int) (pb.IstioCertificateServiceClient, func(call int) context.Context, spiffe.ID)) {
	type client struct {
		cl  pb.IstioCertificateServiceClient
		ctx func(int) context.Context
		csr string
	}
	cls := make([]client, benchClients)
	for i := range cls {
		cl, ctx, id := connect(i)
		_, csr := newCSR(b, alg, id)
		cls[i] = client{cl: cl, ctx: ctx, csr: csr}
		// Connect (and review the token) before the clock starts.
		if _, err := cl.CreateCertificate(ctx(-1), &pb.IstioCertificateRequest{Csr: csr}); err != nil {
			b.Fatal(err)
		}
	}
	work := make(chan int, b.N)
	for call := range b.N {
		work <- call
	}
	close(work)
	latencies := make([][]time.Duration, benchClients)
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for i, c := range cls {
		wg.Go(func() {
			for call := range work {
				ctx := c.ctx(call)
				t0 := time.Now()
				if _, err := c.cl.CreateCertificate(ctx, &pb.IstioCertificateRequest{Csr: c.csr}); err != nil {
					b.Error(err)
					return
				}
				latencies[i] = append(latencies[i], time.Since(t0))
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	all := slices.Concat(latencies...)
	slices.Sort(all)
	if len(all) > 0 {
		b.ReportMetric(float64(len(all))/elapsed.Seconds(), "certs/s")
		b.ReportMetric(float64(all[len(all)*99/100].Microseconds())/1000, "p99-ms")
	}
}
