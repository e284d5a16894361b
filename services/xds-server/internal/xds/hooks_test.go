package xds

import (
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	statuspb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"sailplane.dev/services/xds-server/internal/model"
)

// armed is when each armed timer fires, from now.
func (f *fakeClock) armed() []time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []time.Duration
	for _, t := range f.timers {
		if t.armed {
			out = append(out, t.at.Sub(f.now))
		}
	}
	return out
}

// TestNackBackoffGate: the delay NackBackoff asks for a sequence of requests on one stream.
func TestNackBackoffGate(t *testing.T) {
	const base, maxDelay = 100 * time.Millisecond, 350 * time.Millisecond
	proxy := &model.Proxy{ID: "p.demo"}
	nackOf := func(typeURL, nonce string) Request {
		return Request{Stream: StreamInfo{ID: 1, Proxy: proxy}, TypeURL: typeURL, Nonce: nonce, Err: status.New(codes.InvalidArgument, "bad")}
	}
	ackOf := func(typeURL, nonce string) Request {
		return Request{Stream: StreamInfo{ID: 1, Proxy: proxy}, TypeURL: typeURL, Nonce: nonce}
	}
	for _, tc := range []struct {
		name string
		reqs []Request
		want []time.Duration
	}{
		{"one NACK costs nothing", []Request{nackOf(cds, "1")}, []time.Duration{0}},
		{"grows from the second NACK, capped",
			[]Request{nackOf(cds, "1"), nackOf(cds, "2"), nackOf(cds, "3"), nackOf(cds, "4"), nackOf(cds, "5")},
			[]time.Duration{0, base, 2 * base, maxDelay, maxDelay}},
		{"an ACK ends it",
			[]Request{nackOf(cds, "1"), nackOf(cds, "2"), ackOf(cds, "3"), nackOf(cds, "4"), nackOf(cds, "5")},
			[]time.Duration{0, base, 0, 0, base}},
		{"repeating the NACKed nonce is no ACK",
			[]Request{nackOf(cds, "1"), nackOf(cds, "2"), ackOf(cds, "2"), nackOf(cds, "3")},
			[]time.Duration{0, base, 0, 2 * base}},
		{"a first request is no ACK",
			[]Request{nackOf(cds, "1"), ackOf(cds, ""), nackOf(cds, "2")},
			[]time.Duration{0, 0, base}},
		{"types count apart",
			[]Request{nackOf(cds, "1"), nackOf(eds, "2"), nackOf(cds, "3"), ackOf(eds, "4"), nackOf(cds, "5")},
			[]time.Duration{0, 0, base, 0, 2 * base}},
		{"debug clients are not counted",
			[]Request{{Stream: StreamInfo{ID: 2}, TypeURL: TypeSyncz, Err: status.New(codes.Internal, "x")},
				{Stream: StreamInfo{ID: 2}, TypeURL: TypeSyncz, Err: status.New(codes.Internal, "x")}},
			[]time.Duration{0, 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := NewNackBackoff(base, maxDelay)
			var got []time.Duration
			for _, r := range tc.reqs {
				d, err := b.Request(r)
				if err != nil {
					t.Fatal(err)
				}
				got = append(got, d)
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("delays = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestNackBackoffMemory: a stream's runs are bounded by maxNackTypes, and forgotten when it
// ends or ACKs.
func TestNackBackoffMemory(t *testing.T) {
	b := NewNackBackoff(0, 0)
	s := StreamInfo{ID: 7, Proxy: &model.Proxy{ID: "p.demo"}}
	for i := range 3 * maxNackTypes {
		if _, err := b.Request(Request{Stream: s, TypeURL: fmt.Sprint("type.example/T", i), Nonce: "1", Err: status.New(codes.Internal, "no")}); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(b.runs[s.ID]); n != maxNackTypes {
		t.Fatalf("%d types tracked, want at most %d", n, maxNackTypes)
	}
	for i := range maxNackTypes {
		_, _ = b.Request(Request{Stream: s, TypeURL: fmt.Sprint("type.example/T", i), Nonce: "2"})
	}
	if len(b.runs) != 0 || b.streams.Load() != 0 {
		t.Fatalf("after ACKs: %d streams tracked (count %d), want none", len(b.runs), b.streams.Load())
	}
	_, _ = b.Request(Request{Stream: s, TypeURL: cds, Nonce: "3", Err: status.New(codes.Internal, "no")})
	b.Disconnected(s)
	if len(b.runs) != 0 || b.streams.Load() != 0 {
		t.Fatalf("after disconnect: %d streams tracked (count %d), want none", len(b.runs), b.streams.Load())
	}
}

// TestNackBackoffHoldsType: a real stream that keeps NACKing clusters gets no clusters while
// held, however the config changes, and the latest at once when the hold ends; the hold doubles
// with each NACK in a row and starts over after an ACK. Other types are not held.
func TestNackBackoffHoldsType(t *testing.T) {
	const base = time.Second
	clock := &fakeClock{now: time.Unix(0, 0)}
	e := newEnv(t, Options{Clock: clock, Observers: []Observer{NewNackBackoff(base, 8*base)}}, baseMesh()...)
	c := newSotW(t, e.addr, node("p", "demo", false))
	c.subscribe(cds)
	c.recvType(cds)
	svc := 0
	// change adds a service: a new version of clusters, pushed.
	change := func() {
		svc++
		e.updatePushed(services("demo", fmt.Sprintf("s%d.demo", svc)))
	}
	// hasLatest reports whether resp carries the newest service's cluster.
	hasLatest := func(resp *discoverygrpc.DiscoveryResponse) bool {
		return slices.Contains(sotwNames(t, resp), cluster(fmt.Sprintf("s%d.demo", svc)))
	}
	// nackNext receives the clusters of the last change, NACKs them, and checks the hold the
	// server put on clusters for it (0: none): the stream handles requests in order, so once
	// the barrier after the NACK is answered, the hold is armed.
	nackNext := func(want time.Duration, when string) {
		t.Helper()
		resp := c.recvRaw()
		if resp.GetTypeUrl() != cds || !hasLatest(resp) {
			t.Fatalf("%s: got %s without the latest cluster", when, short(resp.GetTypeUrl()))
		}
		c.send(nack(resp, nil))
		c.drain()
		var wantArmed []time.Duration
		if want > 0 {
			wantArmed = []time.Duration{want}
		}
		if got := clock.armed(); !slices.Equal(got, wantArmed) {
			t.Fatalf("%s: holds %v, want %v", when, got, wantArmed)
		}
	}

	change()
	nackNext(0, "one NACK") // the next version goes out at the push
	change()
	nackNext(base, "second NACK in a row")
	change()
	change()
	if got := c.drain(); len(got) != 0 {
		t.Fatalf("held type sent: %v", types_(got))
	}
	// The other types are not held.
	c.subscribe(lds)
	c.recvType(lds)
	// The hold ends: the latest clusters at once.
	clock.Advance(base)
	nackNext(2*base, "third NACK in a row")
	change()
	if clock.Advance(base) {
		t.Fatal("hold ended after half its time")
	}
	if got := c.drain(); slices.ContainsFunc(got, isCDS) {
		t.Fatalf("held type sent: %v", types_(got))
	}
	clock.Advance(base)
	if resp := c.recvType(cds); !hasLatest(resp) { // ACKed
		t.Fatal("after the hold: not the latest clusters")
	}
	// After the ACK a NACK starts over.
	change()
	nackNext(0, "an ACK, then one NACK")
	change()
	nackNext(base, "an ACK, then two NACKs")
}

// TestNackBackoffHoldsDeltaType: the same hold on a delta stream.
func TestNackBackoffHoldsDeltaType(t *testing.T) {
	const base = time.Second
	clock := &fakeClock{now: time.Unix(0, 0)}
	e := newEnv(t, Options{Clock: clock, Observers: []Observer{NewNackBackoff(base, 8*base)}}, baseMesh()...)
	c := newDelta(t, e.addr, node("p", "demo", false))
	c.send(&discoverygrpc.DeltaDiscoveryRequest{TypeUrl: cds})
	c.recvType(cds)
	for i, want := range []time.Duration{0, base} {
		e.updatePushed(services("demo", fmt.Sprintf("s%d.demo", i)))
		resp := c.recvRaw()
		c.send(&discoverygrpc.DeltaDiscoveryRequest{TypeUrl: cds, ResponseNonce: resp.GetNonce(),
			ErrorDetail: &statuspb.Status{Code: int32(codes.InvalidArgument), Message: "rejected by test"}})
		c.drain()
		if got := clock.armed(); (want == 0) != (len(got) == 0) || (want > 0 && got[0] != want) {
			t.Fatalf("NACK %d: holds %v, want %v", i+1, got, want)
		}
	}
	e.updatePushed(services("demo", "held.demo"))
	if got := c.drain(); len(got) != 0 {
		t.Fatalf("held type sent: %v", deltaTypes(got))
	}
	clock.Advance(base)
	if got := names(c.recvType(cds).GetResources()); !slices.Contains(got, cluster("held.demo")) {
		t.Fatalf("after the hold: %v, want the held change", got)
	}
}

func isCDS(r *discoverygrpc.DiscoveryResponse) bool { return r.GetTypeUrl() == cds }

// refuser is an Admitter refusing one namespace and a RequestGate refusing one type.
type refuser struct {
	NopObserver
	connected atomic.Int64
}

func (r *refuser) Admit(s StreamInfo) error {
	if s.Proxy.Namespace == "banned" {
		return status.Error(codes.PermissionDenied, "banned namespace")
	}
	return nil
}

func (r *refuser) Request(req Request) (time.Duration, error) {
	if req.TypeURL == rds {
		return 0, status.Error(codes.Unimplemented, "no routes for you")
	}
	return 0, nil
}

func (r *refuser) Connected(StreamInfo) { r.connected.Add(1) }

// TestHooksRefuse: an Admitter's and a RequestGate's refusals end the stream with their status;
// a refused proxy is never connected.
func TestHooksRefuse(t *testing.T) {
	for _, tc := range []struct {
		name      string
		ns, typ   string
		want      codes.Code
		connected int64
	}{
		{"admitted", "demo", cds, codes.OK, 1},
		{"not admitted", "banned", cds, codes.PermissionDenied, 0},
		{"request refused", "demo", rds, codes.Unimplemented, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &refuser{}
			e := newEnv(t, Options{Observers: []Observer{r}}, baseMesh()...)
			c := newSotW(t, e.addr, node("p", tc.ns, false))
			c.send(&discoverygrpc.DiscoveryRequest{TypeUrl: tc.typ})
			_, err := c.s.Recv()
			if got := status.Code(err); got != tc.want {
				t.Fatalf("stream ended with %v, want %v", err, tc.want)
			}
			if tc.want == codes.OK {
				c.drain()
				if n := e.srv.Connections(); n != 1 {
					t.Fatalf("%d connections, want 1", n)
				}
			}
			if n := r.connected.Load(); n != tc.connected {
				t.Fatalf("connected %d times, want %d", n, tc.connected)
			}
		})
	}
}
