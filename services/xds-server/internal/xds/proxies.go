package xds

import (
	"cmp"
	"context"
	"slices"
	"strings"
	"time"

	statusv3 "github.com/envoyproxy/go-control-plane/envoy/service/status/v3"
	"google.golang.org/grpc/peer"

	"sailplane.dev/services/xds-server/internal/model"
)

// ProxySync is a connected proxy's sync state as the debug types, the monitoring port's debug
// endpoints and the status page show it: one reading, shaped by each.
type ProxySync struct {
	Proxy *model.Proxy
	// Conn numbers the stream on this server; ConnectedAt is when it opened, Address the
	// client's address.
	Conn        int64
	ConnectedAt time.Time
	Address     string
	// Watches are the watched types, by type URL.
	Watches []WatchSync
}

// WatchSync is the state of one watched type.
type WatchSync struct {
	TypeURL string
	// Names are the subscribed resource names (none for a wildcard subscription).
	Names []string
	// Status is istiod's: SYNCED, STALE, NOT_SENT, or ERROR after a NACK.
	Status                   statusv3.ConfigStatus
	SentNonce, SentVersion   string
	SentAt                   time.Time
	AckedNonce, AckedVersion string
	// NackError is the last NACK's message, until the client ACKs again.
	NackError, NackedVersion string
	NackedAt                 time.Time
}

// ConnectedProxies lists the proxies of the streams open, in no order: Proxies without their
// sync state, cheap enough for every metrics scrape.
func (s *Server) ConnectedProxies() []*model.Proxy {
	conns := s.connList()
	out := make([]*model.Proxy, 0, len(conns))
	for _, c := range conns {
		out = append(out, c.proxy)
	}
	return out
}

// Proxies is the sync state of every connected proxy, ordered by ID (then stream).
func (s *Server) Proxies() []ProxySync {
	conns := s.connList()
	slices.SortFunc(conns, func(a, b *conn) int {
		return cmp.Or(strings.Compare(a.proxy.ID, b.proxy.ID), cmp.Compare(a.id, b.id))
	})
	out := make([]ProxySync, 0, len(conns))
	for _, c := range conns {
		out = append(out, c.syncState())
	}
	return out
}

func (c *conn) syncState() ProxySync {
	ps := ProxySync{Proxy: c.proxy, Conn: c.id, ConnectedAt: c.connectedAt, Address: c.address}
	c.mu.Lock()
	names := make(map[string][]string, len(c.watches))
	for t, w := range c.watches {
		names[t] = w.sub.sorted
	}
	c.mu.Unlock()
	status := c.s.status.of(c.id)
	for _, t := range sortedKeys(names) {
		ws := status[t]
		ps.Watches = append(ps.Watches, WatchSync{
			TypeURL: t, Names: names[t], Status: ws.configStatus(),
			SentNonce: ws.sentNonce, SentVersion: ws.sentVersion, SentAt: ws.sentAt,
			AckedNonce: ws.ackedNonce, AckedVersion: ws.ackedVersion,
			NackError: ws.nackError, NackedVersion: ws.nackedVersion, NackedAt: ws.nackedAt,
		})
	}
	return ps
}

// peerAddress is the address of a stream's client, "" when unknown.
func peerAddress(ctx context.Context) string {
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		return p.Addr.String()
	}
	return ""
}
