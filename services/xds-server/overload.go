package xdsserver

import (
	"cmp"
	"context"
	"fmt"
	"sync"
	"time"

	orcaservice "github.com/cncf/xds/go/xds/service/orca/v3"
	"github.com/spf13/pflag"
	"google.golang.org/grpc"
)

// Overload configures admission control, send timeouts and rebalancing across replicas
// (admission.go, rebalance.go). The zero value takes the defaults.
type Overload struct {
	// MaxInitializing bounds the ADS streams in their initial push at once; default 100 per
	// core. Ten times as many may wait for a place.
	MaxInitializing int
	// AdmissionWait is how long a new stream waits for a place before it is refused with
	// Unavailable and a retry delay; default 5s (well within the 15s that Envoy and gRPC wait
	// for a first response before they give up on a resource).
	AdmissionWait time.Duration
	// AdmissionRate bounds new ADS streams per second (a token bucket, burst one second's
	// worth); default 500 per core, negative: no bound.
	AdmissionRate float64
	// InitialPushTimeout ends a stream's initial push, giving its place to another, when its
	// client has not answered everything by then; default 10s.
	InitialPushTimeout time.Duration
	// SendTimeout closes the connection of a stream whose response could not be handed to
	// the client for this long (it stopped reading); default 30s, negative: never.
	SendTimeout time.Duration
	// Peers are the other replicas' plaintext xDS addresses (host:port; a host name stands
	// for all its addresses, so a headless Service names every replica). Empty: no
	// rebalancing.
	Peers []string
	// RebalanceInterval is how often the replicas' loads are compared; default 10s.
	RebalanceInterval time.Duration
	// RebalanceMargin is how far above the average a replica sheds connections; default 0.1
	// (10 %).
	RebalanceMargin float64
}

// AddFlags registers the overload flags.
func (o *Overload) AddFlags(fs *pflag.FlagSet) {
	fs.IntVar(&o.MaxInitializing, "xds-max-initializing", 0,
		"ADS streams in their initial push at once; ten times as many wait up to --xds-admission-wait, the rest are refused with Unavailable and a retry delay (default 100 per core)")
	fs.DurationVar(&o.AdmissionWait, "xds-admission-wait", defaultAdmissionWait, "how long a new ADS stream waits for a place before it is refused")
	fs.Float64Var(&o.AdmissionRate, "xds-admission-rate", 0, "new ADS streams accepted per second (default 500 per core; negative: unbounded)")
	fs.DurationVar(&o.InitialPushTimeout, "xds-initial-push-timeout", defaultInitialPushTimeout,
		"a stream whose client has not answered its initial push by then stops counting against --xds-max-initializing")
	fs.DurationVar(&o.SendTimeout, "xds-send-timeout", defaultSendTimeout,
		"close a client connection whose xDS response could not be sent for this long (the client stopped reading); negative: never")
	fs.StringSliceVar(&o.Peers, "xds-peers", nil,
		"the other xds-server replicas' plaintext xDS addresses (host:port; a headless Service's name stands for every replica): when this replica holds more ADS connections than their average, it closes some of its newest so that they spread; empty: no rebalancing")
	fs.DurationVar(&o.RebalanceInterval, "xds-rebalance-interval", defaultRebalanceInterval, "how often the replicas' loads are compared (with --xds-peers)")
	fs.Float64Var(&o.RebalanceMargin, "xds-rebalance-margin", defaultRebalanceMargin, "how far above the replicas' average load (0.1 = 10 %) a replica sheds connections")
}

func (o *Overload) withDefaults() (Overload, error) {
	c := *o
	if c.MaxInitializing < 0 || c.AdmissionWait < 0 || c.InitialPushTimeout < 0 || c.RebalanceInterval < 0 || c.RebalanceMargin < 0 {
		return c, fmt.Errorf("%w: negative overload setting", ErrInvalidConfig)
	}
	c.MaxInitializing = cmp.Or(c.MaxInitializing, defaultMaxInitializing())
	c.AdmissionWait = cmp.Or(c.AdmissionWait, defaultAdmissionWait)
	c.AdmissionRate = cmp.Or(c.AdmissionRate, defaultAdmissionRate())
	c.InitialPushTimeout = cmp.Or(c.InitialPushTimeout, defaultInitialPushTimeout)
	c.SendTimeout = cmp.Or(c.SendTimeout, defaultSendTimeout)
	c.RebalanceInterval = cmp.Or(c.RebalanceInterval, defaultRebalanceInterval)
	c.RebalanceMargin = cmp.Or(c.RebalanceMargin, defaultRebalanceMargin)
	return c, nil
}

// overloadOptions are the gRPC server options of admission control.
func (s *Server) overloadOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.ChainStreamInterceptor(s.admission.intercept)}
}

// registerLoad serves this replica's load reports on gs, for its peers.
func (s *Server) registerLoad(gs *grpc.Server) {
	orcaservice.RegisterOpenRcaServiceServer(gs, &loadReporter{instance: s.instance, load: s.admission.Streams})
}

// runOverload runs admission control's housekeeping and, with peers, the rebalancer.
func (s *Server) runOverload(ctx context.Context, wg *sync.WaitGroup) {
	wg.Go(func() { _ = s.admission.Run(ctx) })
	o := s.cfg.Overload
	if len(o.Peers) == 0 {
		return
	}
	r := &rebalancer{
		log: s.log.With("component", "rebalance"), instance: s.instance, peers: o.Peers,
		interval: o.RebalanceInterval, margin: o.RebalanceMargin, load: s.admission.Streams,
		shed: func(n int) int {
			closed := 0
			for _, st := range s.admission.newest(n) {
				if s.conns.close(st.peer) {
					s.admission.metrics.close(reasonRebalance)
					closed++
				}
			}
			return closed
		},
	}
	wg.Go(func() { _ = r.Run(ctx) })
}
