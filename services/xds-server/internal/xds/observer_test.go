package xds

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	statuspb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
)

// recorder is an Observer keeping every call, as a line and as it came.
type recorder struct {
	mu    sync.Mutex
	lines []string
	calls []any
}

var _ Observer = (*recorder)(nil)

func (r *recorder) add(line string, call any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lines = append(r.lines, line)
	r.calls = append(r.calls, call)
}

func (r *recorder) Connected(s StreamInfo) { r.add("connected "+s.Proxy.ID, s) }

func (r *recorder) Disconnected(s StreamInfo) { r.add("disconnected "+s.Proxy.ID, s) }

func (r *recorder) Responded(resp Response) {
	r.add(fmt.Sprintf("responded %s push=%t", short(resp.TypeURL), resp.Push != nil), resp)
}

func (r *recorder) Answered(a Answer) {
	verdict := "ACK"
	if a.Err != nil {
		verdict = "NACK " + a.Err.Message()
	}
	r.add(fmt.Sprintf("answered %s %s", short(a.Response.TypeURL), verdict), a)
}

func (r *recorder) Pushed(p Push) {
	r.add(fmt.Sprintf("pushed full=%t err=%v", p.Request.Full, p.Err), p)
}

// snapshot is what was recorded so far.
func (r *recorder) snapshot() ([]string, []any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.lines), slices.Clone(r.calls)
}

// waitLines waits until n calls were recorded and returns them.
func (r *recorder) waitLines(t *testing.T, n int) ([]string, []any) {
	t.Helper()
	waitUntil(t, func() bool {
		lines, _ := r.snapshot()
		return len(lines) >= n
	})
	return r.snapshot()
}

// The observers see a real stream: its connection, a response to a request and its ACK, a push
// and its NACK, the push done, the disconnection; each call carrying what it is about.
func TestObserverChain(t *testing.T) {
	for _, tc := range []struct {
		name  string
		delta bool
	}{{"sotw", false}, {"delta", true}} {
		t.Run(tc.name, func(t *testing.T) {
			first, second := &recorder{}, &recorder{}
			e := newEnv(t, Options{Observers: []Observer{first, second}}, baseMesh()...)
			var (
				nackPushed func()
				closeSend  func() error
			)
			if tc.delta {
				c := newDelta(t, e.addr, node("p", "demo", false))
				c.send(&discoverygrpc.DeltaDiscoveryRequest{TypeUrl: cds})
				c.recvType(cds)
				nackPushed = func() {
					resp := c.recvRaw()
					c.send(&discoverygrpc.DeltaDiscoveryRequest{TypeUrl: cds, ResponseNonce: resp.GetNonce(),
						ErrorDetail: &statuspb.Status{Code: 3, Message: "rejected by test"}})
				}
				closeSend = c.s.CloseSend
			} else {
				c := newSotW(t, e.addr, node("p", "demo", false))
				c.subscribe(cds)
				c.recvType(cds)
				nackPushed = func() { c.send(nack(c.recvRaw(), nil)) }
				closeSend = c.s.CloseSend
			}
			first.waitLines(t, 3)
			e.update(destinationRule("demo", "a", "a.demo"))
			nackPushed()
			first.waitLines(t, 6)
			if err := closeSend(); err != nil {
				t.Fatal(err)
			}
			lines, calls := first.waitLines(t, 7)
			// The push is done once its response is sent; the NACK may come before or after.
			want := []string{"connected p.demo", "responded Cluster push=false", "answered Cluster ACK",
				"responded Cluster push=true", "answered Cluster NACK rejected by test", "pushed full=true err=<nil>",
				"disconnected p.demo"}
			if lines[4] != want[4] {
				want[4], want[5] = want[5], want[4]
			}
			if !slices.Equal(lines, want) {
				t.Fatalf("calls =\n%s\nwant\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
			}
			if got, _ := second.snapshot(); !slices.Equal(got, lines) {
				t.Errorf("second observer saw\n%s", strings.Join(got, "\n"))
			}

			stream := calls[0].(StreamInfo)
			if stream.Delta != tc.delta || stream.Proxy == nil || stream.ID == 0 {
				t.Errorf("stream = %+v", stream)
			}
			answered := calls[1].(Response)
			if answered.Stream != stream || answered.Resources != 2 || answered.Bytes == 0 || answered.Nonce == "" ||
				answered.Version == "" || answered.Sent.IsZero() {
				t.Errorf("response to the request = %+v", answered)
			}
			if ack := calls[2].(Answer); ack.Response != answered || ack.Err != nil || ack.At.Before(answered.Sent) {
				t.Errorf("ACK = %+v, want one of %+v", ack, answered)
			}
			pushed := calls[3].(Response)
			var nacked Answer
			var push Push
			for _, c := range calls[4:6] {
				switch c := c.(type) {
				case Answer:
					nacked = c
				case Push:
					push = c
				}
			}
			if nacked.Response != pushed || nacked.Err.Code() != codes.InvalidArgument {
				t.Errorf("NACK = %+v, want one of %+v", nacked, pushed)
			}
			if pushed.Push != push.Request || push.Stream != stream || push.Err != nil {
				t.Errorf("push = %+v, its response's request %p", push, pushed.Push)
			}
			if !(!push.Request.Start.After(push.Queued) && !push.Queued.After(push.Started) &&
				!push.Started.After(pushed.Sent) && !pushed.Sent.After(push.Done)) {
				t.Errorf("push times out of order: change %v, queued %v, started %v, sent %v, done %v",
					push.Request.Start, push.Queued, push.Started, pushed.Sent, push.Done)
			}
			if calls[6].(StreamInfo) != stream {
				t.Errorf("disconnected %+v, want %+v", calls[6], stream)
			}
		})
	}
}
