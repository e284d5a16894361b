package kube

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"sailplane.dev/shared/spiffe"
)

// Token review verdicts. ErrTokenRefused is the token's fault (invalid, expired, another
// audience, not a service account's); ErrTokenReviewUnavailable is the API server failing to
// answer, not the caller's.
var (
	ErrTokenRefused           = errors.New("token refused")
	ErrTokenReviewUnavailable = errors.New("cannot review the token now")
)

// DefaultTokenAudiences are the audiences a service-account token must be valid for, as istiod's
// TOKEN_AUDIENCES default: what pilot-agent asks for (its istio-token is projected for istio-ca).
var DefaultTokenAudiences = []string{"istio-ca"}

// TokenReviewOptions tune a TokenReviewer; the zero value takes the defaults.
type TokenReviewOptions struct {
	// Audiences the token must be valid for (one of them); DefaultTokenAudiences when empty.
	Audiences []string
	// TrustDomain names the identities; "cluster.local" when empty.
	TrustDomain string
	// TTL is how long a successful review is reused (1m when zero); Size bounds how many are
	// kept (10000 when zero).
	TTL  time.Duration
	Size int
}

// TokenReviewer checks service-account tokens with the API server (TokenReview), as istiod's
// kube JWT authenticator does, and reuses a successful review for a while, so that a storm of
// requests with the same token (a fleet restarting, each asking the ca and then xDS) costs one
// TokenReview. Concurrent reviews of one token share one request. Safe for concurrent use.
type TokenReviewer struct {
	kube kubernetes.Interface
	opts TokenReviewOptions

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

// NewTokenReviewer returns a reviewer asking kube.
func NewTokenReviewer(kube kubernetes.Interface, opts TokenReviewOptions) *TokenReviewer {
	if len(opts.Audiences) == 0 {
		opts.Audiences = DefaultTokenAudiences
	}
	opts.TrustDomain = cmp.Or(opts.TrustDomain, "cluster.local")
	opts.TTL = cmp.Or(opts.TTL, time.Minute)
	opts.Size = cmp.Or(opts.Size, 10000)
	return &TokenReviewer{kube: kube, opts: opts, cache: map[string]cachedReview{}, inFlight: map[string]*review{}}
}

// Audiences are the audiences a token must be valid for.
func (r *TokenReviewer) Audiences() []string { return slices.Clone(r.opts.Audiences) }

// Review returns the SPIFFE ID of the service account whose token this is, or an error wrapping
// ErrTokenRefused or ErrTokenReviewUnavailable. Refusals are not cached: a token may become valid
// (its account created), and a refused caller is not served anyway.
func (r *TokenReviewer) Review(ctx context.Context, token string) (spiffe.ID, error) {
	key := hashToken(token)
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
			return spiffe.ID{}, fmt.Errorf("%w: %w", ErrTokenReviewUnavailable, ctx.Err())
		}
	}
	rv := &review{done: make(chan struct{})}
	r.inFlight[key] = rv
	r.mu.Unlock()

	rv.id, rv.err = r.ask(ctx, token)

	r.mu.Lock()
	delete(r.inFlight, key)
	if rv.err == nil {
		r.evict()
		r.cache[key] = cachedReview{id: rv.id, expires: time.Now().Add(r.opts.TTL)}
	}
	r.mu.Unlock()
	close(rv.done)
	return rv.id, rv.err
}

// evict makes room for one entry: expired reviews go first, then arbitrary ones.
func (r *TokenReviewer) evict() {
	if len(r.cache) < r.opts.Size {
		return
	}
	now := time.Now()
	for k, e := range r.cache {
		if now.After(e.expires) {
			delete(r.cache, k)
		}
	}
	for k := range r.cache {
		if len(r.cache) < r.opts.Size {
			break
		}
		delete(r.cache, k)
	}
}

func (r *TokenReviewer) ask(ctx context.Context, token string) (spiffe.ID, error) {
	res, err := r.kube.AuthenticationV1().TokenReviews().Create(ctx, &authnv1.TokenReview{
		Spec: authnv1.TokenReviewSpec{Token: token, Audiences: r.opts.Audiences},
	}, metav1.CreateOptions{})
	if err != nil {
		return spiffe.ID{}, fmt.Errorf("%w: TokenReview: %w", ErrTokenReviewUnavailable, err)
	}
	st, want := res.Status, r.opts.Audiences
	switch {
	case st.Error != "":
		return spiffe.ID{}, fmt.Errorf("%w: token review: %s", ErrTokenRefused, st.Error)
	case !st.Authenticated:
		return spiffe.ID{}, fmt.Errorf("%w: the token is not authenticated", ErrTokenRefused)
	case !slices.Contains(st.User.Groups, "system:serviceaccounts"):
		return spiffe.ID{}, fmt.Errorf("%w: the token is not a service account's (user %q)", ErrTokenRefused, st.User.Username)
	case !slices.ContainsFunc(st.Audiences, func(a string) bool { return slices.Contains(want, a) }):
		return spiffe.ID{}, fmt.Errorf("%w: the token is valid for %v, not for %v", ErrTokenRefused, st.Audiences, want)
	}
	id, err := spiffe.FromServiceAccountUser(r.opts.TrustDomain, st.User.Username)
	if err != nil {
		return spiffe.ID{}, fmt.Errorf("%w: %w", ErrTokenRefused, err)
	}
	return id, nil
}

// TokenFingerprint names a token in log lines without revealing it: the first 16 hex digits of
// its SHA-256.
func TokenFingerprint(token string) string { return hashToken(token)[:16] }

func hashToken(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}
