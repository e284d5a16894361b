// Package consul publishes the services of a Consul catalog as registry resources
// (schema.Service and schema.Endpoints, named "<Namespace>/<name>.<HostSuffix>").
//
// It follows the catalog with blocking queries: one on the service list, and one per service on
// its health endpoint, started and stopped as services come and go. Only what changed is
// published. When Consul cannot be reached the last known state stays published (errors never
// delete anything) and queries are retried with exponential backoff; the first successful
// answers after an outage are a full resync, so services removed meanwhile are deleted then.
//
// Mapping (close to Istio's former Consul registry):
//   - hostname "<service>.<HostSuffix>", resolution STATIC, registry "consul", not mesh-external;
//   - one port per distinct instance port, its protocol from the instance meta "protocol"
//     (tcp, http, http2, grpc, https, tls, udp; anything else or none is TCP), named after the
//     protocol in lower case, with "-<port>" appended when two ports share a protocol;
//   - one endpoint per instance: the service address, else the node's; workload
//     "<node>/<service ID>"; locality region = datacenter; labels from tags ("k=v", Istio's
//     "k|v", or a bare "k" as k="") overlaid with the service meta;
//   - health as Consul DNS answers by default: UNHEALTHY when a service or node check is
//     critical or in maintenance, HEALTHY otherwise (warnings included);
//   - Connect proxies and gateways are skipped; a service left with no instance is deleted.
package consul

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/hashicorp/consul/api"
	"go.opentelemetry.io/otel/metric"
	"google.golang.org/protobuf/proto"

	discoveryv1 "sailplane.dev/proto/discovery/v1"
	"sailplane.dev/services/endpoint-watcher/internal/changetrace"
	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/schema"
)

// Defaults of Config.
const (
	DefaultAddress        = "127.0.0.1:8500"
	DefaultHostSuffix     = "service.consul"
	DefaultNamespace      = "consul"
	DefaultWaitTime       = 5 * time.Minute
	DefaultMinWait        = 100 * time.Millisecond
	DefaultBackoffInitial = 500 * time.Millisecond
	// A Consul back from an outage is found within DefaultBackoffMax (with 30 s, TestFaults
	// measured 16 s after a 30 s outage); a query every 5 s is nothing to an agent.
	DefaultBackoffMax      = 5 * time.Second
	maxConsulWaitTime      = 10 * time.Minute // Consul caps ?wait at 10m.
	minConsulWaitTimeLimit = time.Second
)

// ErrConfig is wrapped by every error New returns for an invalid Config.
var ErrConfig = errors.New("consul: invalid config")

// Backoff bounds the delay between retries after a failed query: it starts at Initial, doubles
// on every consecutive failure up to Max, and is jittered.
type Backoff struct {
	Initial time.Duration // DefaultBackoffInitial when zero
	Max     time.Duration // DefaultBackoffMax when zero
}

// Config configures a Source.
type Config struct {
	// Address is Consul's HTTP API address, "127.0.0.1:8500" or "https://host:8501".
	// CONSUL_HTTP_ADDR, else DefaultAddress, when empty. The other CONSUL_HTTP_* variables
	// (TLS files, basic auth) apply as they do for the consul CLI.
	Address string
	// Token is the ACL token (CONSUL_HTTP_TOKEN when empty). It is sent in a header and never
	// logged nor included in errors.
	Token string
	// Datacenter to read; the agent's own when empty.
	Datacenter string
	// HostSuffix makes hostnames "<service>.<HostSuffix>"; DefaultHostSuffix when empty.
	HostSuffix string
	// Namespace is the bus namespace of the resources; DefaultNamespace when empty.
	Namespace string
	// ClusterID is stamped on every Service and Endpoint as given.
	ClusterID string
	// Backoff between retries of failed queries.
	Backoff Backoff
	// WaitTime is how long one blocking query may wait for a change; DefaultWaitTime when zero,
	// between 1s and Consul's 10m limit.
	WaitTime time.Duration
	// MinWait is the least time between the starts of two queries of one watch, the rate limit
	// Consul recommends for blocking queries (a hot key otherwise turns them into a busy loop);
	// DefaultMinWait when zero, none when negative.
	MinWait time.Duration
	// MeterProvider receives sailplane_consul_watch_errors_total; the global provider when nil.
	MeterProvider metric.MeterProvider
}

func (c *Config) setDefaults() error {
	if c.HostSuffix == "" {
		c.HostSuffix = DefaultHostSuffix
	}
	if c.Namespace == "" {
		c.Namespace = DefaultNamespace
	}
	if c.Backoff.Initial <= 0 {
		c.Backoff.Initial = DefaultBackoffInitial
	}
	if c.Backoff.Max <= 0 {
		c.Backoff.Max = DefaultBackoffMax
	}
	if c.Backoff.Max < c.Backoff.Initial {
		return fmt.Errorf("%w: Backoff.Max %s is below Backoff.Initial %s", ErrConfig, c.Backoff.Max, c.Backoff.Initial)
	}
	if c.WaitTime == 0 {
		c.WaitTime = DefaultWaitTime
	}
	if c.WaitTime < minConsulWaitTimeLimit || c.WaitTime > maxConsulWaitTime {
		return fmt.Errorf("%w: WaitTime %s is outside [%s, %s]", ErrConfig, c.WaitTime, minConsulWaitTimeLimit, maxConsulWaitTime)
	}
	if c.MinWait == 0 {
		c.MinWait = DefaultMinWait
	}
	return nil
}

// Source watches a Consul catalog and publishes it.
type Source struct {
	cfg       Config
	pub       bus.Publisher
	log       *slog.Logger
	client    *api.Client
	transport *http.Transport
	token     string // only to redact it from errors
	// watchErrors is sailplane_consul_watch_errors_total{query}.
	watchErrors metric.Int64Counter
	// reachable wakes the watches waiting to retry when one of them reaches Consul again, so
	// that all resync at once, not each at the end of its own backoff.
	reachable *wakeup

	runOnce   sync.Once
	ready     chan struct{}
	readyOnce sync.Once
}

// New checks cfg and builds the Consul client; nothing is contacted before Run. log may be nil.
func New(cfg Config, pub bus.Publisher, log *slog.Logger) (*Source, error) {
	if pub == nil {
		return nil, fmt.Errorf("%w: nil Publisher", ErrConfig)
	}
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ac := api.DefaultConfig()
	if cfg.Address != "" {
		ac.Address = cfg.Address
	} else if ac.Address == "localhost:8500" {
		ac.Address = DefaultAddress
	}
	if cfg.Token != "" {
		ac.Token = cfg.Token
	}
	// From here the token lives in the api client (which sends it as a header) and in s.token,
	// used only to redact it; the Source's copy of Config does not hold it.
	token := ac.Token
	cfg.Token = ""
	ac.Datacenter = cfg.Datacenter
	client, err := api.NewClient(ac)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, redact(err, token))
	}
	return &Source{
		watchErrors: newWatchErrors(cfg.MeterProvider),
		cfg:         cfg,
		pub:         pub,
		log:         log.With("registry", Registry, "consul", ac.Address),
		client:      client,
		transport:   ac.Transport,
		token:       token,
		reachable:   &wakeup{},
		ready:       make(chan struct{}),
	}, nil
}

// Ready is closed once the first full state of the catalog was published.
func (s *Source) Ready() <-chan struct{} { return s.ready }

// serviceWatch is the blocking query of one service's instances.
type serviceWatch struct {
	cancel context.CancelFunc
	synced bool
}

type instances struct {
	name    string
	w       *serviceWatch
	entries []*api.ServiceEntry
	at      time.Time // when Consul answered
}

type published struct {
	svc *discoveryv1.Service
	eps *discoveryv1.Endpoints
}

// serviceListQuery names the watch of the service list, in logs and metrics.
const serviceListQuery = "service list"

// ErrAlreadyRun is returned by Run when called a second time.
var ErrAlreadyRun = errors.New("consul: Source.Run called twice")

// Run follows the catalog and publishes until ctx is done, then returns nil. Resources stay
// published when Run returns. A Source runs once.
func (s *Source) Run(ctx context.Context) error {
	first := false
	s.runOnce.Do(func() { first = true })
	if !first {
		return ErrAlreadyRun
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
		// Blocking queries hold keep-alive connections; nothing uses them after Run.
		s.transport.CloseIdleConnections()
	}()

	// All publishing happens on this goroutine, so a watch being stopped cannot publish
	// after its service was deleted: its late results are dropped below.
	lists := make(chan serviceList)
	updates := make(chan instances)
	wg.Go(func() {
		watch(ctx, s, serviceListQuery, false, func(q *api.QueryOptions) (map[string][]string, *api.QueryMeta, error) {
			return s.client.Catalog().Services(q)
		}, func(v map[string][]string) bool { return send(ctx, lists, serviceList{v, time.Now()}) })
	})

	watches := map[string]*serviceWatch{}
	state := map[string]*published{}
	listSynced, pending := false, 0
	for {
		select {
		case <-ctx.Done():
			return nil
		case l := <-lists:
			names := l.names
			ectx, end := s.event(l.at, serviceListQuery, "")
			for name, w := range watches {
				if _, ok := names[name]; ok {
					continue
				}
				w.cancel()
				delete(watches, name)
				if !w.synced {
					pending--
				}
				s.publish(ectx, name, nil, nil, state)
			}
			end()
			for name := range names {
				if watches[name] != nil {
					continue
				}
				wctx, wcancel := context.WithCancel(ctx)
				w := &serviceWatch{cancel: wcancel}
				watches[name] = w
				pending++
				wg.Go(func() {
					watch(wctx, s, "service "+name, true, func(q *api.QueryOptions) ([]*api.ServiceEntry, *api.QueryMeta, error) {
						return s.client.Health().Service(name, "", false, q)
					}, func(v []*api.ServiceEntry) bool {
						return send(wctx, updates, instances{name: name, w: w, entries: v, at: time.Now()})
					})
				})
			}
			listSynced = true
		case u := <-updates:
			if watches[u.name] != u.w {
				continue // from a watch stopped since
			}
			if !u.w.synced {
				u.w.synced = true
				pending--
			}
			svc, eps := translate(&s.cfg, u.name, u.entries)
			ectx, end := s.event(u.at, "service", u.name)
			s.publish(ectx, u.name, svc, eps, state)
			end()
		}
		if listSynced && pending == 0 {
			s.readyOnce.Do(func() {
				close(s.ready)
				s.log.Info("published initial consul registry", "services", len(state))
			})
		}
	}
}

// serviceList is an answer of the service list's query.
type serviceList struct {
	names map[string][]string
	at    time.Time // when Consul answered
}

// event starts the handling of a query's answer at: what it publishes is its trace (see
// changetrace).
func (s *Source) event(at time.Time, kind, name string) (context.Context, func()) {
	return changetrace.Start(context.Background(), changetrace.Event{
		At: at, Registry: Registry, Kind: kind, Name: name, Cluster: s.cfg.ClusterID})
}

// publish makes the bus hold svc and eps for the Consul service name (deleting both when nil),
// sending only the resources that differ from what was last published, in the trace of ctx's
// answer.
func (s *Source) publish(ctx context.Context, name string, svc *discoveryv1.Service, eps *discoveryv1.Endpoints, state map[string]*published) {
	pub := changetrace.Publisher(ctx, s.pub)
	old := state[name]
	if svc == nil {
		if old == nil {
			return
		}
		delete(state, name)
		n := s.resourceName(old.svc.GetHostname())
		pub.Delete(schema.Endpoints.TypeURL, n)
		pub.Delete(schema.Service.TypeURL, n)
		s.log.Debug("deleted service", "name", n)
		return
	}
	if old == nil {
		old = &published{}
	}
	n := s.resourceName(svc.GetHostname())
	// The Service goes first so that consumers never see endpoints of an unknown host.
	if !proto.Equal(old.svc, svc) {
		pub.Upsert(schema.Service.TypeURL, &bus.Resource{Name: n, Body: svc})
	}
	if !proto.Equal(old.eps, eps) {
		pub.Upsert(schema.Endpoints.TypeURL, &bus.Resource{Name: n, Body: eps})
		s.log.Debug("published endpoints", "name", n, "endpoints", len(eps.GetEndpoints()))
	}
	state[name] = &published{svc: svc, eps: eps}
}

func (s *Source) resourceName(hostname string) string { return s.cfg.Namespace + "/" + hostname }

func send[T any](ctx context.Context, ch chan<- T, v T) bool {
	select {
	case ch <- v:
		return true
	case <-ctx.Done():
		return false
	}
}
