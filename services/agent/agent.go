// Package agent runs beside each workload, pod or VM, as Istio's istio-agent does: it generates
// the workload's private key locally (it never leaves), gets the certificate for its identity
// from the ca over Istio's CreateCertificate API (a service-account token first, then its own
// certificate), renews it at 80 % of its lifetime, and hands it out as Envoy's SDS over a Unix
// socket and, for proxyless gRPC, as files with a gRPC xDS bootstrap pointing at them. For Envoy
// it also writes the bootstrap and proxies ADS from a local socket to the xDS server. It needs
// no Kubernetes client and links nothing of the ca's signing code.
package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"

	ndsv1 "sailplane.dev/proto/istio/networking/nds/v1"
	"sailplane.dev/services/agent/internal/dnsproxy"
	"sailplane.dev/shared/component"
	"sailplane.dev/shared/grpcbootstrap"
	"sailplane.dev/shared/telemetry"
	"sailplane.dev/shared/workloadcert"
)

// Credential is a workload certificate with its key and the trust bundle it came with.
type Credential = workloadcert.Credential

// ErrCA marks the ca refusing a request (as opposed to being unreachable).
var ErrCA = workloadcert.ErrCA

// Config configures the agent. The outputs (SDS socket, files, bootstrap, readiness) are each
// off when their setting is empty; the binary's flags turn them on at Istio's paths.
type Config struct {
	// Config is where and how the certificate is asked for (the ca's address, Istio's CA_ADDR
	// default when empty; the root file, required; the token file or the provisioned folder: set
	// ProvisionedCertDir to OutputDir and a restarted agent authenticates with the certificate
	// it last got).
	workloadcert.Config

	// SDSSocket is the Unix socket serving Envoy's SDS ("default" and "ROOTCA").
	SDSSocket string
	// OutputDir receives cert-chain.pem, key.pem and root-cert.pem for proxyless gRPC.
	OutputDir string
	// FileRefresh is how often gRPC re-reads those files (the bootstrap's refresh_interval);
	// 900s (Istio's) when zero.
	FileRefresh time.Duration
	// GRPCBootstrap is where the gRPC xDS bootstrap goes (GRPC_XDS_BOOTSTRAP); it needs OutputDir.
	GRPCBootstrap string
	// XDSAddress is the xDS server the bootstrap names; XDSOverTLS makes that channel mTLS with
	// the workload's certificate instead of plaintext.
	XDSAddress string
	XDSOverTLS bool
	// Pod, Namespace, IP and Labels describe the workload in the bootstrap's node (Istio's node
	// ID and metadata); the namespace defaults to the identity's.
	Pod, Namespace, IP string
	Labels             map[string]string

	// ProxyType is the node type Envoy's bootstrap and the name-table stream present:
	// grpcbootstrap.Sidecar (when empty) or grpcbootstrap.Router for a gateway, as pilot-agent's
	// `proxy sidecar` and `proxy router`.
	ProxyType string

	// XDSProxySocket is a Unix socket forwarding ADS streams (SotW and delta) to XDSAddress,
	// over mTLS with the workload certificate when XDSOverTLS: what Envoy's bootstrap points at.
	XDSProxySocket string

	// EnvoyBootstrap is where Envoy's bootstrap goes: ADS through XDSProxySocket, SDS from
	// SDSSocket (both needed), the node as istiod knows it.
	EnvoyBootstrap string
	// EnvoyAdmin is Envoy's admin address (host:port), written in its bootstrap and scraped for
	// its stats; 127.0.0.1:15000 (Istio's) when empty.
	EnvoyAdmin string

	// DNSCapture (Istio's ISTIO_META_DNS_CAPTURE) serves DNS on DNSAddr from the xDS server's
	// name table, forwarding other names to ResolvConf's nameservers (on DNSUpstreamPort, 53
	// when empty: for tests); the node metadata then says DNS_CAPTURE, and DNS_AUTO_ALLOCATE
	// with DNSAutoAllocate. DNSAddr is dnsproxy.DefaultAddr (127.0.0.1:15053) when empty.
	DNSCapture, DNSAutoAllocate bool
	DNSAddr, ResolvConf         string
	DNSUpstreamPort             string

	// ReadinessAddr serves /healthz/agent (200 once a certificate is held, else 503),
	// /healthz/ready (the same, and Envoy ready with EnvoyReadiness), POST /drain, and the
	// agent's Prometheus metrics at /stats/prometheus and /metrics, with Envoy's when it runs.
	ReadinessAddr string
	// EnvoyReadiness makes /healthz/ready wait for Envoy, asked on EnvoyAdmin as pilot-agent
	// does: its first LDS and CDS updates accepted, the server LIVE and its workers started.
	EnvoyReadiness bool
}

// Deps are the agent's collaborators.
type Deps struct {
	Logger *slog.Logger
	// DialOptions are added to the connection to the ca (tests observe the requests with them).
	DialOptions []grpc.DialOption
	// Metrics is where the agent records and what it serves on ReadinessAddr; the process's
	// (telemetry.Global) when nil.
	Metrics *telemetry.Metrics
}

// Agent is one workload's agent.
type Agent struct {
	cfg  Config
	log  *slog.Logger
	deps Deps
	sds  *sdsServer
	// certs gets and renews the certificate (shared with the Sailplane services).
	certs *workloadcert.Client
	// metrics are recorded in deps.Metrics.
	metrics *agentMetrics
	// envoy is Envoy's admin API.
	envoy *envoyAdmin

	ready         chan struct{}
	readyOnce     sync.Once
	mu            sync.Mutex
	current       *Credential
	published     int // certificates published so far
	readinessAddr net.Addr

	// dns is the DNS proxy, nil without DNS capture; nameTable is the last table it got.
	dns       *dnsproxy.Server
	nameTable atomic.Pointer[ndsv1.NameTable]
}

// DefaultCAAddress is Istio's CA_ADDR default.
const DefaultCAAddress = "istiod.istio-system.svc:15012"

// New checks cfg; nothing is read or written before Run.
func New(cfg Config, deps Deps) (*Agent, error) {
	if deps.Logger == nil {
		deps.Logger = slog.Default()
	}
	if cfg.CAAddress == "" {
		cfg.CAAddress = DefaultCAAddress
	}
	if cfg.ClusterID == "" {
		cfg.ClusterID = "Kubernetes"
	}
	if cfg.EnvoyAdmin == "" {
		cfg.EnvoyAdmin = "127.0.0.1:15000"
	}
	if deps.Metrics == nil {
		m, err := telemetry.Global()
		if err != nil {
			return nil, fmt.Errorf("agent: %w", err)
		}
		deps.Metrics = m
	}
	if cfg.FileRefresh <= 0 {
		cfg.FileRefresh = 900 * time.Second
	}
	switch cfg.ProxyType {
	case "", grpcbootstrap.Sidecar, grpcbootstrap.Router:
	default:
		return nil, fmt.Errorf("agent: proxy type %q is neither %s nor %s", cfg.ProxyType, grpcbootstrap.Sidecar, grpcbootstrap.Router)
	}
	switch {
	case cfg.XDSProxySocket != "" && cfg.XDSAddress == "":
		return nil, errors.New("agent: the xDS proxy needs the xDS server's address")
	case cfg.EnvoyBootstrap != "" && (cfg.XDSProxySocket == "" || cfg.SDSSocket == ""):
		return nil, errors.New("agent: the Envoy bootstrap points at the xDS proxy and SDS sockets: set both")
	case cfg.GRPCBootstrap != "" && cfg.OutputDir == "":
		return nil, errors.New("agent: the gRPC bootstrap points at the credential files: set the output folder too")
	}
	certs, err := workloadcert.New(cfg.Config, deps.Logger, deps.DialOptions...)
	if err != nil {
		return nil, fmt.Errorf("agent: %w", err)
	}
	a := &Agent{cfg: cfg, log: deps.Logger, deps: deps, certs: certs, ready: make(chan struct{}), envoy: newEnvoyAdmin(cfg.EnvoyAdmin)}
	a.metrics = newAgentMetrics(a, deps.Metrics.MeterProvider())
	if a.dns, err = newDNSProxy(cfg, deps, a.metrics); err != nil {
		return nil, err
	}
	certs.Observe(a.metrics.certRequested)
	if cfg.SDSSocket != "" {
		a.sds = newSDSServer(a.log, deps.Metrics.MeterProvider())
	}
	return a, nil
}

// Run gets the first certificate and keeps it renewed, serving SDS, the xDS proxy and readiness,
// until ctx ends.
func (a *Agent) Run(ctx context.Context) error {
	if a.cfg.OutputDir != "" {
		if err := os.MkdirAll(a.cfg.OutputDir, 0o755); err != nil {
			return fmt.Errorf("agent: output folder: %w", err)
		}
	}
	var m component.Manager
	m.Add("certificates", component.Func(func(ctx context.Context) error { return a.certs.Rotate(ctx, a.publish, a.renewTime) }))
	if a.sds != nil {
		m.Add("sds", component.Func(func(ctx context.Context) error { return a.sds.run(ctx, a.cfg.SDSSocket) }))
	}
	if a.cfg.XDSProxySocket != "" {
		m.Add("xds-proxy", component.Func(a.runXDSProxy))
	}
	if a.dns != nil {
		m.Add("dns-proxy", a.dns)
		m.Add("name-table", component.Func(a.watchNameTable))
	}
	if a.cfg.ReadinessAddr != "" {
		m.Add("readiness", component.Func(a.serveReadiness))
	}
	if err := m.Run(ctx); err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	return nil
}

// Ready is closed once the agent holds a certificate (and has published it).
func (a *Agent) Ready() <-chan struct{} { return a.ready }

// Current is the certificate the agent holds, nil before the first.
func (a *Agent) Current() *Credential {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.current
}

// Published is how many certificates the agent has handed out so far.
func (a *Agent) Published() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.published
}

// Credential file names in OutputDir (Istio's workload-spiffe-credentials layout).
const (
	CertChainFile = workloadcert.CertChainFile
	KeyFile       = workloadcert.KeyFile
	RootCertFile  = workloadcert.RootCertFile
)

// publish hands a new certificate to every output: files first (so the bootstrap never names
// missing files), then the bootstraps (written once, with the first certificate, which names the
// workload's namespace and service account), then SDS.
func (a *Agent) publish(ctx context.Context, c *Credential) error {
	if dir := a.cfg.OutputDir; dir != "" {
		// The key before the chain: gRPC's file_watcher re-reads both and keeps the old pair
		// while they do not match, never serving a half-written file (each write is a rename).
		for _, f := range []struct {
			name string
			data []byte
			perm os.FileMode
		}{{KeyFile, c.KeyPEM, 0o600}, {CertChainFile, c.ChainPEM, 0o644}, {RootCertFile, c.RootsPEM, 0o644}} {
			if err := grpcbootstrap.WriteAtomic(filepath.Join(dir, f.name), f.data, f.perm); err != nil {
				return fmt.Errorf("write %s: %w", f.name, err)
			}
		}
		if a.cfg.GRPCBootstrap != "" && a.Published() == 0 {
			if err := a.writeGRPCBootstrap(c); err != nil {
				return err
			}
		}
	}
	if a.cfg.EnvoyBootstrap != "" && a.Published() == 0 {
		if err := a.writeEnvoyBootstrap(c); err != nil {
			return err
		}
	}
	if a.sds != nil {
		if err := a.sds.update(ctx, c); err != nil {
			return err
		}
	}
	a.mu.Lock()
	a.current = c
	a.published++
	a.mu.Unlock()
	a.readyOnce.Do(func() {
		a.metrics.startup.Record(ctx, time.Since(processStart).Seconds())
		close(a.ready)
	})
	return nil
}

// nodeType is the node ID's type: a sidecar unless configured as a router (a gateway).
func (a *Agent) nodeType() string {
	if a.cfg.ProxyType == "" {
		return grpcbootstrap.Sidecar
	}
	return a.cfg.ProxyType
}

// workload is how the bootstraps present the workload: the namespace defaults to its identity's.
func (a *Agent) workload(c *Credential) grpcbootstrap.Workload {
	ns := a.cfg.Namespace
	if ns == "" {
		ns = c.ID.Namespace
	}
	return grpcbootstrap.Workload{
		XDSAddress: a.cfg.XDSAddress, XDSOverTLS: a.cfg.XDSOverTLS,
		IP: a.cfg.IP, Pod: a.cfg.Pod, Namespace: ns, ServiceAccount: c.ID.ServiceAccount,
		ClusterID: a.cfg.ClusterID, Labels: a.cfg.Labels,
	}
}

func (a *Agent) writeGRPCBootstrap(c *Credential) error {
	dir, err := filepath.Abs(a.cfg.OutputDir) // gRPC resolves relative paths from its own working folder
	if err != nil {
		return err
	}
	w := a.workload(c)
	w.Credentials = &grpcbootstrap.Files{
		CertChain: filepath.Join(dir, CertChainFile), Key: filepath.Join(dir, KeyFile), Roots: filepath.Join(dir, RootCertFile),
		RefreshInterval: fmt.Sprintf("%ds", int(a.cfg.FileRefresh.Seconds())),
	}
	b, err := grpcbootstrap.New(w)
	if err != nil {
		return err
	}
	if err := b.WriteFile(a.cfg.GRPCBootstrap); err != nil {
		return fmt.Errorf("write the gRPC bootstrap: %w", err)
	}
	return nil
}

// renewTime is renewAt, early enough that gRPC, re-reading the files every FileRefresh, sees
// the new certificate before the old one expires: two refresh intervals before (one to be read,
// one of slack), but not before half the lifetime, so a refresh interval as long as the
// certificate cannot make the agent renew in a loop.
func (a *Agent) renewTime(c *Credential, jitter float64) time.Time {
	at := workloadcert.RenewAt(c.Leaf(), c.Received, jitter)
	if a.cfg.OutputDir == "" {
		return at
	}
	if seen := c.Leaf().NotAfter.Add(-2 * a.cfg.FileRefresh); seen.Before(at) {
		at = seen
		if half := c.Received.Add(c.Leaf().NotAfter.Sub(c.Received) / 2); at.Before(half) {
			at = half
		}
	}
	return at
}
