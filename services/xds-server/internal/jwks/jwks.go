// Package jwks fetches the keys of RequestAuthentication jwksUris for the xds-server, which
// inlines them into Envoy's jwt_authn filter as istiod does by default
// (PILOT_JWT_ENABLE_REMOTE_JWKS=false): proxies need no route to the identity provider.
package jwks

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"sync"
	"time"
)

// Defaults, as istiod's: keys are refetched every 20 minutes; a failed fetch is retried sooner.
const (
	DefaultRefresh = 20 * time.Minute
	DefaultRetry   = 30 * time.Second
	DefaultTimeout = 5 * time.Second
	// maxDocument bounds what is read of a JWKS response.
	maxDocument = 1 << 20
)

// Sink receives fetched keys (Store.SetJWKS).
type Sink interface {
	SetJWKS(uri, keys string)
}

// ErrFetch wraps every fetch failure.
var ErrFetch = errors.New("jwks: fetch")

// Resolver keeps the keys of the wanted URIs in a Sink: a new URI is fetched at once, every
// URI is refetched each Refresh, a failure is retried each Retry. A URI whose keys cannot be
// fetched gets a key nobody holds the private half of, so tokens are rejected (fail closed,
// as istiod) rather than the filter failing.
type Resolver struct {
	sink    Sink
	log     *slog.Logger
	client  *http.Client
	refresh time.Duration
	retry   time.Duration

	mu      sync.Mutex
	wanted  map[string]time.Time // URI -> when to fetch next
	wake    chan struct{}
	noKeys  string
	noKeysE error
}

// New returns a resolver writing into sink; zero durations take the defaults.
func New(sink Sink, log *slog.Logger, timeout, refresh, retry time.Duration) *Resolver {
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	if refresh <= 0 {
		refresh = DefaultRefresh
	}
	if retry <= 0 {
		retry = DefaultRetry
	}
	return &Resolver{sink: sink, log: log, client: &http.Client{Timeout: timeout}, refresh: refresh, retry: retry,
		wanted: map[string]time.Time{}, wake: make(chan struct{}, 1)}
}

// Want sets the URIs whose keys are needed; new ones are fetched at once, dropped ones
// forgotten. It does not block.
func (r *Resolver) Want(uris []string) {
	r.mu.Lock()
	var dropped []string
	for u := range r.wanted {
		if !slices.Contains(uris, u) {
			delete(r.wanted, u)
			dropped = append(dropped, u)
		}
	}
	added := false
	for _, u := range uris {
		if _, ok := r.wanted[u]; !ok {
			r.wanted[u] = time.Time{}
			added = true
		}
	}
	r.mu.Unlock()
	for _, u := range dropped {
		r.sink.SetJWKS(u, "")
	}
	if added {
		select {
		case r.wake <- struct{}{}:
		default:
		}
	}
}

// Run fetches until ctx ends.
func (r *Resolver) Run(ctx context.Context) error {
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		next := r.FetchDue(ctx, time.Now())
		wait := time.Until(next)
		if next.IsZero() {
			wait = r.refresh
		}
		t.Reset(max(wait, 0))
		select {
		case <-ctx.Done():
			return nil
		case <-r.wake:
		case <-t.C:
		}
	}
}

// FetchDue fetches the URIs due at now and returns when the next one is due (zero: none).
func (r *Resolver) FetchDue(ctx context.Context, now time.Time) time.Time {
	r.mu.Lock()
	var due []string
	for u, at := range r.wanted {
		if !at.After(now) {
			due = append(due, u)
		}
	}
	r.mu.Unlock()
	slices.Sort(due)
	for _, u := range due {
		keys, err := r.fetch(ctx, u)
		next := now.Add(r.refresh)
		if err != nil {
			if ctx.Err() != nil {
				return time.Time{}
			}
			r.log.Warn("cannot fetch JWKS; tokens of its issuer are rejected until it can be fetched", "uri", u, "err", err)
			next = now.Add(r.retry)
			if keys, err = r.publicOnly(); err != nil {
				r.log.Error("cannot build a fail-closed JWKS", "err", err)
				continue
			}
		}
		r.mu.Lock()
		_, still := r.wanted[u]
		if still {
			r.wanted[u] = next
		}
		r.mu.Unlock()
		if still {
			r.sink.SetJWKS(u, keys)
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	var first time.Time
	for _, at := range r.wanted {
		if first.IsZero() || at.Before(first) {
			first = at
		}
	}
	return first
}

// fetch GETs uri and checks that the answer is a JWKS document with keys.
func (r *Resolver) fetch(ctx context.Context, uri string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, uri, nil)
	if err != nil {
		return "", fmt.Errorf("%w: %s: %w", ErrFetch, uri, err)
	}
	resp, err := r.client.Do(req)
	if err != nil {
		return "", fmt.Errorf("%w: %s: %w", ErrFetch, uri, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("%w: %s: status %s", ErrFetch, uri, resp.Status)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxDocument+1))
	if err != nil {
		return "", fmt.Errorf("%w: %s: %w", ErrFetch, uri, err)
	}
	if len(body) > maxDocument {
		return "", fmt.Errorf("%w: %s: document larger than %d bytes", ErrFetch, uri, maxDocument)
	}
	var doc struct {
		Keys []map[string]any `json:"keys"`
	}
	if err := json.Unmarshal(body, &doc); err != nil || len(doc.Keys) == 0 {
		return "", fmt.Errorf("%w: %s: not a JWKS document with keys", ErrFetch, uri)
	}
	return string(body), nil
}

// publicOnly is a JWKS with one EC key whose private half was discarded: it parses, and
// verifies no token.
func (r *Resolver) publicOnly() (string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.noKeys != "" || r.noKeysE != nil {
		return r.noKeys, r.noKeysE
	}
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		r.noKeysE = err
		return "", err
	}
	raw, err := k.PublicKey.Bytes() // 0x04 || X || Y
	if err != nil {
		r.noKeysE = err
		return "", err
	}
	enc := base64.RawURLEncoding.EncodeToString
	b, _ := json.Marshal(map[string]any{"keys": []any{map[string]any{
		"kty": "EC", "crv": "P-256", "alg": "ES256", "kid": "sailplane-fail-closed",
		"x": enc(raw[1:33]), "y": enc(raw[33:]),
	}}})
	r.noKeys = string(b)
	return r.noKeys, nil
}

// Wanted lists the URIs being kept, sorted (for tests and debugging).
func (r *Resolver) Wanted() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Sorted(maps.Keys(r.wanted))
}
