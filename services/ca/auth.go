package ca

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	"sailplane.dev/shared/pki"
	"sailplane.dev/shared/spiffe"
)

// Authentication failures. errUnavailable is the API server failing to answer, not the caller's fault.
var (
	errUnauthenticated = errors.New("unauthenticated")
	errUnavailable     = errors.New("cannot review the token now")
)

// caller is who asked, for the log line of a refusal and for the certificate.
type caller struct {
	addr  string
	id    spiffe.ID // zero until authenticated
	token string    // a short hash of the bearer token, never the token
	via   string    // "certificate" or "token"
}

func (c caller) logAttrs() []any {
	attrs := []any{"peer", c.addr}
	if c.via != "" {
		attrs = append(attrs, "auth", c.via)
	}
	if c.id != (spiffe.ID{}) {
		attrs = append(attrs, "identity", c.id.String())
	}
	if c.token != "" {
		attrs = append(attrs, "token-sha256", c.token)
	}
	return attrs
}

// authenticate finds the caller's identity: a client certificate this ca issued, else a
// service-account token in "authorization: Bearer", reviewed by the API server.
func (s *Service) authenticate(ctx context.Context, auth *pki.Authority) (caller, error) {
	c := caller{addr: "unknown"}
	p, ok := peer.FromContext(ctx)
	if ok && p.Addr != nil {
		c.addr = p.Addr.String()
	}
	tlsInfo, isTLS := p.AuthInfo.(credentials.TLSInfo)
	if isTLS && len(tlsInfo.State.PeerCertificates) > 0 {
		c.via = "certificate"
		id, err := s.certIdentity(auth, tlsInfo.State.PeerCertificates)
		c.id = id
		return c, err
	}

	md, _ := metadata.FromIncomingContext(ctx)
	token, found := bearerToken(md.Get("authorization"))
	if !found {
		return c, fmt.Errorf("%w: neither a client certificate nor an authorization: Bearer token", errUnauthenticated)
	}
	c.via, c.token = "token", tokenHash(token)[:16]
	if !isTLS {
		return c, fmt.Errorf("%w: a bearer token over plaintext is refused", errUnauthenticated)
	}
	if ids := md.Get("clusterid"); len(ids) == 1 && ids[0] != "" && ids[0] != s.cfg.ClusterID {
		return c, fmt.Errorf("%w: the caller claims cluster %q, this ca knows only %q", errUnauthenticated, ids[0], s.cfg.ClusterID)
	}
	if s.kube == nil {
		return c, fmt.Errorf("%w: tokens cannot be reviewed without Kubernetes; use a client certificate", errUnauthenticated)
	}
	id, err := s.tokens().review(ctx, token)
	c.id = id
	return c, err
}

func bearerToken(values []string) (string, bool) {
	for _, v := range values {
		if t, ok := strings.CutPrefix(v, "Bearer "); ok && t != "" {
			return t, true
		}
	}
	return "", false
}

func tokenHash(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

// certIdentity verifies a client chain against the roots now and reads its one SPIFFE URI SAN.
func (s *Service) certIdentity(auth *pki.Authority, chain []*x509.Certificate) (spiffe.ID, error) {
	if err := auth.Verify(chain[0], chain[1:], x509.ExtKeyUsageClientAuth); err != nil {
		return spiffe.ID{}, fmt.Errorf("%w: client certificate: %w", errUnauthenticated, err)
	}
	if len(chain[0].URIs) != 1 {
		return spiffe.ID{}, fmt.Errorf("%w: client certificate has %d URI SANs, want one SPIFFE ID", errUnauthenticated, len(chain[0].URIs))
	}
	id, err := spiffe.FromURL(chain[0].URIs[0])
	if err != nil {
		return spiffe.ID{}, fmt.Errorf("%w: client certificate: %w", errUnauthenticated, err)
	}
	return id, nil
}

// tokenReviewer reviews service-account tokens with the API server, reusing a review for a
// while so a storm of requests with the same token costs one TokenReview.
type tokenReviewer struct {
	kube        kubernetes.Interface
	audiences   []string
	trustDomain string
	ttl         time.Duration
	size        int

	mu       sync.Mutex
	cache    map[string]cachedReview // by token hash
	inFlight map[string]*review
}

type cachedReview struct {
	id      spiffe.ID
	expires time.Time
}

type review struct {
	done chan struct{}
	id   spiffe.ID
	err  error
}

func (s *Service) tokens() *tokenReviewer {
	s.reviewerOnce.Do(func() {
		s.reviewer = &tokenReviewer{
			kube: s.kube, audiences: s.cfg.TokenAudiences, trustDomain: s.cfg.TrustDomain,
			ttl: s.cfg.TokenCacheTTL, size: s.cfg.TokenCacheSize,
			cache: map[string]cachedReview{}, inFlight: map[string]*review{},
		}
	})
	return s.reviewer
}

func (r *tokenReviewer) review(ctx context.Context, token string) (spiffe.ID, error) {
	key := tokenHash(token)
	r.mu.Lock()
	if e, ok := r.cache[key]; ok && time.Now().Before(e.expires) {
		r.mu.Unlock()
		return e.id, nil
	}
	if rv, ok := r.inFlight[key]; ok {
		r.mu.Unlock()
		select {
		case <-rv.done:
			return rv.id, rv.err
		case <-ctx.Done():
			return spiffe.ID{}, fmt.Errorf("%w: %w", errUnavailable, ctx.Err())
		}
	}
	rv := &review{done: make(chan struct{})}
	r.inFlight[key] = rv
	r.mu.Unlock()

	rv.id, rv.err = r.ask(ctx, token)

	r.mu.Lock()
	delete(r.inFlight, key)
	if rv.err == nil { // refusals are not cached: a token may become valid (its account created)
		r.evict()
		r.cache[key] = cachedReview{id: rv.id, expires: time.Now().Add(r.ttl)}
	}
	r.mu.Unlock()
	close(rv.done)
	return rv.id, rv.err
}

// evict makes room for one entry: expired reviews go first, then arbitrary ones.
func (r *tokenReviewer) evict() {
	if len(r.cache) < r.size {
		return
	}
	now := time.Now()
	for k, e := range r.cache {
		if now.After(e.expires) {
			delete(r.cache, k)
		}
	}
	for k := range r.cache {
		if len(r.cache) < r.size {
			break
		}
		delete(r.cache, k)
	}
}

func (r *tokenReviewer) ask(ctx context.Context, token string) (spiffe.ID, error) {
	res, err := r.kube.AuthenticationV1().TokenReviews().Create(ctx, &authnv1.TokenReview{
		Spec: authnv1.TokenReviewSpec{Token: token, Audiences: r.audiences},
	}, metav1.CreateOptions{})
	if err != nil {
		return spiffe.ID{}, fmt.Errorf("%w: TokenReview: %w", errUnavailable, err)
	}
	st := res.Status
	switch {
	case st.Error != "":
		return spiffe.ID{}, fmt.Errorf("%w: token review: %s", errUnauthenticated, st.Error)
	case !st.Authenticated:
		return spiffe.ID{}, fmt.Errorf("%w: the token is not authenticated", errUnauthenticated)
	case !slices.Contains(st.User.Groups, "system:serviceaccounts"):
		return spiffe.ID{}, fmt.Errorf("%w: the token is not a service account's (user %q)", errUnauthenticated, st.User.Username)
	case !slices.ContainsFunc(st.Audiences, func(a string) bool { return slices.Contains(r.audiences, a) }):
		return spiffe.ID{}, fmt.Errorf("%w: the token is valid for %v, not for %v", errUnauthenticated, st.Audiences, r.audiences)
	}
	id, err := spiffe.FromServiceAccountUser(r.trustDomain, st.User.Username)
	if err != nil {
		return spiffe.ID{}, fmt.Errorf("%w: %w", errUnauthenticated, err)
	}
	return id, nil
}
