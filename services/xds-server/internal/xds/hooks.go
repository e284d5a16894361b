package xds

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"sailplane.dev/services/xds-server/internal/model"
	"sailplane.dev/shared/grpcserver"
	"sailplane.dev/shared/spiffe"
)

// The hooks the server always runs first: who may be served what.
var (
	_ Admitter    = peerClaims{}
	_ RequestGate = debugAccess{}
	_ RequestGate = (*NackBackoff)(nil)
)

// peerClaims refuses a proxy whose node claims a namespace or service account other than the
// identity it authenticated with (claimsMatchPeer), with PermissionDenied.
type peerClaims struct {
	NopObserver
	log *slog.Logger
}

func (pc peerClaims) Admit(s StreamInfo) error {
	if err := claimsMatchPeer(s.Proxy, s.Peer); err != nil {
		node := grpcserver.ClientText(s.Proxy.NodeID)
		pc.log.Warn("proxy refused", "node", node, "peer", s.Peer, "err", err)
		return status.Errorf(codes.PermissionDenied, "node %q: %v", node, err)
	}
	return nil
}

// claimsMatchPeer checks what a proxy says of itself against the identity it authenticated with
// (its client certificate's or its service-account token's), as istiod does: a workload of one
// namespace or service account must not be served another's config by claiming its name. A peer
// without an identity (plaintext, where istiod asks none either) is not checked.
func claimsMatchPeer(p *model.Proxy, peer string) error {
	if peer == "" {
		return nil
	}
	id, err := spiffe.Parse(peer)
	if err != nil {
		return fmt.Errorf("identity %q: %w", peer, err)
	}
	if p.Namespace != id.Namespace {
		return fmt.Errorf("claims namespace %q, but authenticated as %s", p.Namespace, peer)
	}
	if p.ServiceAccount != "" && p.ServiceAccount != id.ServiceAccount {
		return fmt.Errorf("claims service account %q, but authenticated as %s", p.ServiceAccount, peer)
	}
	return nil
}

// debugAccess refuses Istio's debug types to the clients rule refuses (Options.DebugAccess),
// and to every client when there is no rule.
type debugAccess struct {
	NopObserver
	rule func(ctx context.Context, peer string) error
	log  *slog.Logger
}

func (d debugAccess) Request(r Request) (time.Duration, error) {
	if !isDebugType(r.TypeURL) {
		return 0, nil
	}
	if d.rule == nil {
		return 0, status.Errorf(codes.PermissionDenied, "xds-server: debug types are not served here")
	}
	if err := d.rule(r.Context, r.Stream.Peer); err != nil {
		d.log.Warn("debug request refused", "conn", r.Stream.ID, "type", grpcserver.ClientText(r.TypeURL), "peer", r.Stream.Peer, "err", err)
		return 0, err
	}
	return 0, nil
}

// Defaults of NewNackBackoff.
const (
	DefaultNackBackoff    = time.Second
	DefaultMaxNackBackoff = 30 * time.Second
)

// maxNackTypes bounds the types whose NACKs one stream's backoff counts: a client may NACK any
// type URL it likes, the server serves a handful.
const maxNackTypes = 16

// NackBackoff is a RequestGate holding back a type's responses from a proxy that keeps
// rejecting them, as Kuma's NackBackoff delays its answer to a NACK: from the second NACK in a
// row of a type, for the base delay, doubling with each further NACK up to the maximum; an ACK
// ends it. A single NACK costs nothing: the rejected version is never sent again anyway
// (watch.nacked), so what this slows is a proxy rejecting each new version of a config it
// cannot take (one bad cluster among clusters that keep changing), which would otherwise be
// sent one at every push.
type NackBackoff struct {
	NopObserver
	base, max time.Duration

	// streams counts the entries of runs, so that the common request (an ACK on a stream that
	// never NACKed) takes no lock.
	streams atomic.Int64
	mu      sync.Mutex
	runs    map[int64]map[string]*nackRun // stream ID -> type URL ->
}

// nackRun is a type's NACKs in a row on one stream.
type nackRun struct {
	nacks int
	nonce string // of the last NACK: a request repeating it (a subscription change) is no ACK
}

// NewNackBackoff returns a NackBackoff with the base and maximum delays; 0 takes
// DefaultNackBackoff and DefaultMaxNackBackoff.
func NewNackBackoff(base, maxDelay time.Duration) *NackBackoff {
	if base <= 0 {
		base = DefaultNackBackoff
	}
	if maxDelay <= 0 {
		maxDelay = DefaultMaxNackBackoff
	}
	return &NackBackoff{base: base, max: max(base, maxDelay), runs: map[int64]map[string]*nackRun{}}
}

func (b *NackBackoff) Request(r Request) (time.Duration, error) {
	if r.Stream.Proxy == nil || (r.Err == nil && b.streams.Load() == 0) {
		return 0, nil // debug clients are not pushed; nothing to end
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	types := b.runs[r.Stream.ID]
	if r.Err == nil {
		if run := types[r.TypeURL]; run != nil && r.Nonce != "" && r.Nonce != run.nonce {
			b.forget(r.Stream.ID, types, r.TypeURL)
		}
		return 0, nil
	}
	run := types[r.TypeURL]
	if run == nil {
		if len(types) >= maxNackTypes {
			return 0, nil
		}
		if types == nil {
			types = map[string]*nackRun{}
			b.runs[r.Stream.ID] = types
			b.streams.Add(1)
		}
		run = &nackRun{}
		types[r.TypeURL] = run
	}
	run.nonce = r.Nonce
	if run.nacks++; run.nacks < 2 {
		return 0, nil
	}
	return b.delay(run.nacks), nil
}

// delay is the hold after n NACKs in a row (n >= 2).
func (b *NackBackoff) delay(n int) time.Duration {
	d := b.base
	for i := 2; i < n && d < b.max; i++ {
		d *= 2
	}
	return min(d, b.max)
}

// forget drops a type's run, and the stream's entry with its last; b.mu is held.
func (b *NackBackoff) forget(id int64, types map[string]*nackRun, typeURL string) {
	delete(types, typeURL)
	if len(types) == 0 {
		delete(b.runs, id)
		b.streams.Add(-1)
	}
}

func (b *NackBackoff) Disconnected(s StreamInfo) {
	if b.streams.Load() == 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.runs[s.ID]; ok {
		delete(b.runs, s.ID)
		b.streams.Add(-1)
	}
}
