package ca

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	pb "istio.io/api/security/v1alpha1"

	"sailplane.dev/shared/pki"
	"sailplane.dev/shared/spiffe"
)

// BenchmarkCreateCertificate measures signing throughput and latency of 100 concurrent
// clients, each on its own TLS connection sending CSRs for its own identity; the root, the
// serving and the workload keys are all of the named algorithm. "cert" clients authenticate
// with a certificate the ca issued; "token" clients with a service-account token the real API
// server issued and reviews (once per token: the review is cached).
//
//	go test -run '^$' -bench CreateCertificate -benchtime 3000x ./services/ca/
func BenchmarkCreateCertificate(b *testing.B) {
	parent := b
	var env *kubeEnv // started once, for the whole benchmark
	for _, alg := range []pki.KeyAlgorithm{pki.ECDSAP256, pki.RSA2048} {
		b.Run(string(alg)+"/cert", func(b *testing.B) {
			dir := b.TempDir()
			r := startCA(b, Config{CertDir: dir, KeyAlgorithm: alg})
			benchSigning(b, alg, func(i int) (pb.IstioCertificateServiceClient, context.Context, spiffe.ID) {
				id := spiffe.ID{TrustDomain: "cluster.local", Namespace: "bench", ServiceAccount: fmt.Sprintf("sa-%d", i)}
				return r.client(b, r.RootsPEM(), issueClient(b, dir, id, alg)), context.Background(), id
			})
		})
		b.Run(string(alg)+"/token", func(b *testing.B) {
			if env == nil {
				env = newKubeEnv(parent)
			}
			ns := fmt.Sprintf("bench-%d", time.Now().UnixNano())
			env.namespace(b, ns)
			r := startCA(b, Config{Kube: env.cfg, Namespace: ns, KeyAlgorithm: alg})
			benchSigning(b, alg, func(i int) (pb.IstioCertificateServiceClient, context.Context, spiffe.ID) {
				id := spiffe.ID{TrustDomain: "cluster.local", Namespace: ns, ServiceAccount: fmt.Sprintf("sa-%d", i)}
				token := env.token(b, ns, id.ServiceAccount, "istio-ca")
				return r.client(b, r.RootsPEM(), nil), withToken(context.Background(), token), id
			})
		})
	}
}

// benchSigning runs b.N CreateCertificate calls over 100 clients made by connect.
func benchSigning(b *testing.B, alg pki.KeyAlgorithm, connect func(int) (pb.IstioCertificateServiceClient, context.Context, spiffe.ID)) {
	const clients = 100
	type client struct {
		cl  pb.IstioCertificateServiceClient
		ctx context.Context
		csr string
	}
	cls := make([]client, clients)
	for i := range cls {
		cl, ctx, id := connect(i)
		_, csr := newCSR(b, alg, id)
		cls[i] = client{cl: cl, ctx: ctx, csr: csr}
		// Connect (and review the token) before the clock starts.
		if _, err := cl.CreateCertificate(ctx, &pb.IstioCertificateRequest{Csr: csr}); err != nil {
			b.Fatal(err)
		}
	}
	work := make(chan struct{}, b.N)
	for range b.N {
		work <- struct{}{}
	}
	close(work)
	latencies := make([][]time.Duration, clients)
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for i, c := range cls {
		wg.Go(func() {
			for range work {
				t0 := time.Now()
				if _, err := c.cl.CreateCertificate(c.ctx, &pb.IstioCertificateRequest{Csr: c.csr}); err != nil {
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
