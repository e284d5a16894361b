package grpcserver

import (
	"math/rand/v2"
	"strconv"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// RetryPushbackTrailer is gRPC's server pushback (gRFC A6): clients with a retry policy wait this
// many milliseconds before their next attempt.
const RetryPushbackTrailer = "grpc-retry-pushback-ms"

// Overloaded is the error a server answers when it cannot take a call now but will later: code
// Unavailable, msg, and retryAfter as a google.rpc.RetryInfo detail (what RetryAfter reads).
// Send PushbackTrailer too, for clients that only know gRPC's own retry policy.
func Overloaded(msg string, retryAfter time.Duration) error {
	st := status.New(codes.Unavailable, msg+"; retry in "+retryAfter.Round(time.Millisecond).String())
	if d, err := st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(retryAfter)}); err == nil {
		st = d
	}
	return st.Err()
}

// PushbackTrailer sets the stream's RetryPushbackTrailer to retryAfter.
func PushbackTrailer(ss grpc.ServerStream, retryAfter time.Duration) {
	ss.SetTrailer(metadata.Pairs(RetryPushbackTrailer, strconv.FormatInt(retryAfter.Milliseconds(), 10)))
}

// RetryAfter is the delay a server asked for in an Unavailable error (Overloaded); ok is false
// when err is not one.
func RetryAfter(err error) (time.Duration, bool) {
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.Unavailable {
		return 0, false
	}
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok && ri.GetRetryDelay() != nil {
			return max(ri.GetRetryDelay().AsDuration(), 0), true
		}
	}
	return 0, false
}

// Backoff paces a client's reconnections: jittered exponential delays between Initial and Max,
// except after a refusal that says when to come back (RetryAfter): then that delay, as gRPC's
// server pushback (gRFC A6) replaces the client's own backoff, the server spacing its clients.
// The zero value uses 100ms and 30s.
type Backoff struct {
	Initial, Max time.Duration
	next         time.Duration
}

// Reset starts over from Initial, after a stream that worked.
func (b *Backoff) Reset() { b.next = 0 }

// Next is how long to wait before reconnecting after err.
func (b *Backoff) Next(err error) time.Duration {
	if hint, ok := RetryAfter(err); ok {
		return hint + rand.N(hint/10+1)
	}
	initial, maxDelay := b.Initial, b.Max
	if initial <= 0 {
		initial = 100 * time.Millisecond
	}
	if maxDelay <= 0 {
		maxDelay = 30 * time.Second
	}
	if b.next < initial {
		b.next = initial
	}
	d := b.next
	b.next = min(2*d, maxDelay)
	return d/2 + rand.N(d/2+1)
}
