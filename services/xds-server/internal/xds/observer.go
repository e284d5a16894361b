package xds

import (
	"context"
	"log/slog"
	"time"

	"google.golang.org/grpc/status"

	"sailplane.dev/services/xds-server/internal/model"
	"sailplane.dev/shared/grpcserver"
)

// Observer learns what happens on the server's streams, so that metrics, syncz, tracing, NACK
// backoff and auth plug in without editing the connection code. Calls come from the stream's
// goroutine (Connected, Disconnected, Responded, Answered) or from a push worker (Pushed) and
// must not block. An Observer may also implement Admitter or RequestGate to refuse or hold back.
type Observer interface {
	Connected(s StreamInfo)
	Disconnected(s StreamInfo)
	Responded(r Response) // a response was sent
	Answered(a Answer)    // the client ACKed (a.Err == nil) or NACKed a response
	Pushed(p Push)        // a push to one proxy finished: all its responses sent
}

// StreamInfo is a stream whose proxy identified itself.
type StreamInfo struct {
	ID    int64
	Delta bool
	Peer  string       // authenticated identity (certificate or token), "" without one
	Proxy *model.Proxy // identified proxy (never nil in these calls)
}

// Response is a response sent to a proxy.
type Response struct {
	Stream                  StreamInfo
	TypeURL, Nonce, Version string
	Resources, Removed      int
	Bytes                   int          // encoded size of the response
	Push                    *PushRequest // the push it belongs to; nil when it answers a request
	// Began is when building it began (generation, from the cache or not), Built when it was
	// built and its send began, Sent when the send returned.
	Began, Built, Sent time.Time
}

// Answer is a proxy's ACK or NACK of a response.
type Answer struct {
	Stream   StreamInfo
	Response Response       // the response being answered (as Responded reported it)
	Err      *status.Status // nil: ACK
	At       time.Time
}

// Push is a push to one proxy, done.
type Push struct {
	Stream          StreamInfo
	Request         *PushRequest // Request.Start is when the change was first seen
	Queued, Started time.Time    // when it entered the push queue and when a worker took it
	Done            time.Time
	Err             error
}

// Admitter is an Observer that may refuse a proxy (go-control-plane's OnStreamOpen error, Kuma's
// OnStreamRequest auth): Admit is called when the proxy identifies itself, before any
// observer's Connected, and an error (a gRPC status) ends the stream with it. The stream is
// then neither listed nor served, and no observer hears of it again.
type Admitter interface {
	Admit(s StreamInfo) error
}

// RequestGate is an Observer consulted on every request of a stream before the server handles
// it: proxy types and Istio's debug types alike. An error (a gRPC status) ends the stream with
// it. A delay d > 0 holds back the responses of the request's type on that stream (its answer
// and pushes alike) for d, after which the type is brought up to date at once: Kuma's NACK
// backoff, without holding the stream's goroutine or a push worker while it waits.
type RequestGate interface {
	Request(r Request) (delay time.Duration, err error)
}

// Request is one request of a stream, as RequestGates see it.
type Request struct {
	// Stream is the stream; its Proxy is nil until the proxy identified itself, and stays nil
	// for clients that ask for debug types only.
	Stream  StreamInfo
	Context context.Context // the stream's
	TypeURL string
	Nonce   string         // the response it answers, "" for none
	Err     *status.Status // the NACK's error_detail; nil otherwise
}

// NopObserver does nothing: embed it to implement only some of Observer.
type NopObserver struct{}

func (NopObserver) Connected(StreamInfo)    {}
func (NopObserver) Disconnected(StreamInfo) {}
func (NopObserver) Responded(Response)      {}
func (NopObserver) Answered(Answer)         {}
func (NopObserver) Pushed(Push)             {}

var _ Observer = NopObserver{}

// nackLogger logs NACKs: a proxy rejecting its configuration is what an operator must see.
type nackLogger struct {
	NopObserver
	log *slog.Logger
}

func (l nackLogger) Answered(a Answer) {
	if a.Err == nil {
		return
	}
	attrs := []any{"node", grpcserver.ClientText(a.Stream.Proxy.NodeID), "conn", a.Stream.ID}
	if a.Stream.Peer != "" {
		attrs = append(attrs, "peer", a.Stream.Peer)
	}
	l.log.Warn("proxy rejected configuration", append(attrs, "type", a.Response.TypeURL, "nonce", a.Response.Nonce,
		"version", a.Response.Version, "err", grpcserver.ClientText(a.Err.Message()))...)
}

// observers calls each of its observers in order.
type observers []Observer

var _ Observer = observers(nil)

// chain is the server's observers with the hooks among them picked out once, so that a server
// without hooks pays nothing per request for the possibility.
type chain struct {
	observers
	admitters []Admitter
	gates     []RequestGate
}

func newChain(os ...Observer) chain {
	c := chain{observers: os}
	for _, o := range os {
		if a, ok := o.(Admitter); ok {
			c.admitters = append(c.admitters, a)
		}
		if g, ok := o.(RequestGate); ok {
			c.gates = append(c.gates, g)
		}
	}
	return c
}

// admit asks each Admitter in order; the first refusal wins.
func (c *chain) admit(s StreamInfo) error {
	for _, a := range c.admitters {
		if err := a.Admit(s); err != nil {
			return err
		}
	}
	return nil
}

// request asks each RequestGate in order: the first refusal wins, else the longest delay.
func (c *chain) request(r Request) (time.Duration, error) {
	var hold time.Duration
	for _, g := range c.gates {
		d, err := g.Request(r)
		if err != nil {
			return 0, err
		}
		hold = max(hold, d)
	}
	return hold, nil
}

func (os observers) Connected(s StreamInfo) {
	for _, o := range os {
		o.Connected(s)
	}
}

func (os observers) Disconnected(s StreamInfo) {
	for _, o := range os {
		o.Disconnected(s)
	}
}

func (os observers) Responded(r Response) {
	for _, o := range os {
		o.Responded(r)
	}
}

func (os observers) Answered(a Answer) {
	for _, o := range os {
		o.Answered(a)
	}
}

func (os observers) Pushed(p Push) {
	for _, o := range os {
		o.Pushed(p)
	}
}
