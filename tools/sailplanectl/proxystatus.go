package main

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	statusv3 "github.com/envoyproxy/go-control-plane/envoy/service/status/v3"
	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"sailplane.dev/shared/workloadcert"
	"sailplane.dev/shared/xdstype"
)

// Istio's debug types, served by every xds-server replica for the proxies connected to it.
const (
	typeSyncz      = "istio.io/debug/syncz"
	typeConfigDump = "istio.io/debug/config_dump"
)

// xdsOptions say which xds-server replicas to ask, and how.
type xdsOptions struct {
	addrs     []string
	plaintext bool
	certDir   string
	san       string
	timeout   time.Duration
}

func (o *xdsOptions) addFlags(cmd *cobra.Command) {
	cmd.Flags().StringArrayVar(&o.addrs, "xds-address", []string{"127.0.0.1:15010"},
		"xds-server replica to ask (repeatable: each answers for the proxies connected to it, and the answers are merged)")
	cmd.Flags().BoolVar(&o.plaintext, "plaintext", false,
		"connect without TLS, as to a plaintext --xds-listen on loopback (the default when --cert-dir is not given)")
	cmd.Flags().StringVar(&o.certDir, "cert-dir", "",
		"credential folder (cert-chain.pem, key.pem, root-cert.pem) of an identity in the control plane's namespace, for the TLS port (15012)")
	cmd.Flags().StringVar(&o.san, "xds-san", "", "name the server's certificate must carry (default: the --xds-address host; xds-server's carries istiod.<namespace>.svc)")
	cmd.Flags().DurationVar(&o.timeout, "timeout", 10*time.Second, "how long to wait for each replica")
}

// dialOption is the transport: plaintext, or TLS with the --cert-dir credential.
func (o *xdsOptions) dialOption(addr string) (grpc.DialOption, error) {
	if o.certDir == "" {
		return grpc.WithTransportCredentials(insecure.NewCredentials()), nil
	}
	if o.plaintext {
		return nil, errors.New("--plaintext and --cert-dir: choose one")
	}
	c, err := workloadcert.ReadFolder(o.certDir)
	if err != nil {
		return nil, fmt.Errorf("--cert-dir: %w", err)
	}
	if len(c.Roots) == 0 {
		return nil, fmt.Errorf("--cert-dir %s: no %s to verify the server with", o.certDir, workloadcert.RootCertFile)
	}
	roots := x509.NewCertPool()
	for _, r := range c.Roots {
		roots.AddCert(r)
	}
	name := o.san
	if name == "" {
		name, _, _ = net.SplitHostPort(addr)
	}
	return grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
		MinVersion: tls.VersionTLS12, RootCAs: roots, ServerName: name,
		Certificates: []tls.Certificate{c.TLSCertificate()},
	})), nil
}

// replicaAnswer is one replica's answer to a debug request.
type replicaAnswer struct {
	addr, replica string
	resp          *discoverygrpc.DiscoveryResponse
}

// askAll sends req to every replica at once and returns their answers in address order; any
// replica failing fails the whole, since its proxies would be missing.
func (o *xdsOptions) askAll(ctx context.Context, req *discoverygrpc.DiscoveryRequest) ([]replicaAnswer, error) {
	addrs := slices.Compact(slices.Sorted(slices.Values(o.addrs)))
	out := make([]replicaAnswer, len(addrs))
	errs := make([]error, len(addrs))
	var wg sync.WaitGroup
	for i, addr := range addrs {
		wg.Go(func() {
			resp, err := o.ask(ctx, addr, req)
			if err != nil {
				errs[i] = fmt.Errorf("xds-server %s: %w", addr, err)
				return
			}
			out[i] = replicaAnswer{addr: addr, replica: replicaOf(resp, addr), resp: resp}
		})
	}
	wg.Wait()
	return out, errors.Join(errs...)
}

// ask sends one debug request on a state-of-the-world ADS stream and returns its answer.
func (o *xdsOptions) ask(ctx context.Context, addr string, req *discoverygrpc.DiscoveryRequest) (*discoverygrpc.DiscoveryResponse, error) {
	creds, err := o.dialOption(addr)
	if err != nil {
		return nil, err
	}
	conn, err := grpc.NewClient(addr, creds)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	stream, err := discoverygrpc.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		return nil, err
	}
	// Like istioctl: a node no proxy has, asking for events, not configuration. A copy: the
	// replicas are asked at once.
	md, _ := structpb.NewStruct(map[string]any{"GENERATOR": "event"})
	req = proto.CloneOf(req)
	req.Node = &corev3.Node{Id: "sidecar~~sailplanectl.istio-system~istio-system.svc.cluster.local", Metadata: md}
	if err := stream.Send(req); err != nil {
		return nil, err
	}
	resp, err := stream.Recv()
	if err != nil {
		return nil, err
	}
	_ = stream.CloseSend()
	return resp, nil
}

// replicaOf is the replica's name from the control plane identifier of its answer (istiod's
// JSON: Component, ID, Info), else its address.
func replicaOf(resp *discoverygrpc.DiscoveryResponse, addr string) string {
	var cp struct{ ID string }
	if json.Unmarshal([]byte(resp.GetControlPlane().GetIdentifier()), &cp) == nil && cp.ID != "" {
		return cp.ID
	}
	return addr
}

// proxyStatus is one proxy's sync status on one replica: what -o yaml|json print.
type proxyStatus struct {
	Name         string       `json:"name"`
	Namespace    string       `json:"namespace,omitempty"`
	Cluster      string       `json:"cluster,omitempty"`
	Replica      string       `json:"replica"`
	IstioVersion string       `json:"istioVersion,omitempty"`
	Generator    string       `json:"generator,omitempty"`
	Types        []typeStatus `json:"types"`
}

// typeStatus is the status of one xDS type a proxy watches.
type typeStatus struct {
	Type         string     `json:"type"`
	Status       string     `json:"status"`
	VersionSent  string     `json:"versionSent,omitempty"`
	VersionAcked string     `json:"versionAcked,omitempty"`
	NonceSent    string     `json:"nonceSent,omitempty"`
	NonceAcked   string     `json:"nonceAcked,omitempty"`
	LastSent     *time.Time `json:"lastSent,omitempty"`
	Error        *nackState `json:"error,omitempty"`
}

// nackState is a proxy's last rejection of a type, until it accepts one again.
type nackState struct {
	Details string     `json:"details"`
	Version string     `json:"version,omitempty"`
	At      *time.Time `json:"at,omitempty"`
}

// statusNames are how statuses are shown: istioctl's, with NACKED for what the proxy rejected
// (istioctl's ERROR).
var statusNames = map[statusv3.ConfigStatus]string{
	statusv3.ConfigStatus_SYNCED:   "SYNCED",
	statusv3.ConfigStatus_STALE:    "STALE",
	statusv3.ConfigStatus_NOT_SENT: "NOT SENT",
	statusv3.ConfigStatus_ERROR:    "NACKED",
	statusv3.ConfigStatus_UNKNOWN:  "UNKNOWN",
}

// proxyStatuses reads the syncz answers of every replica, ordered by proxy and replica.
func proxyStatuses(answers []replicaAnswer) ([]proxyStatus, error) {
	var out []proxyStatus
	for _, a := range answers {
		for _, r := range a.resp.GetResources() {
			cc := &statusv3.ClientConfig{}
			if err := r.UnmarshalTo(cc); err != nil {
				return nil, fmt.Errorf("xds-server %s: a syncz resource is not a ClientConfig: %w", a.addr, err)
			}
			md := cc.GetNode().GetMetadata().GetFields()
			ps := proxyStatus{
				Name: cc.GetNode().GetId(), Replica: a.replica,
				Namespace: md["NAMESPACE"].GetStringValue(), Cluster: md["CLUSTER_ID"].GetStringValue(),
				IstioVersion: md["ISTIO_VERSION"].GetStringValue(), Generator: md["GENERATOR"].GetStringValue(),
			}
			for _, g := range cc.GetGenericXdsConfigs() {
				ts := typeStatus{Type: g.GetTypeUrl(), Status: statusNames[g.GetConfigStatus()], VersionSent: g.GetVersionInfo()}
				if g.GetLastUpdated() != nil {
					at := g.GetLastUpdated().AsTime()
					ts.LastSent = &at
				}
				detail := &structpb.Struct{}
				if g.GetXdsConfig().UnmarshalTo(detail) == nil {
					f := detail.GetFields()
					ts.VersionAcked, ts.NonceSent, ts.NonceAcked = f["versionAcked"].GetStringValue(), f["nonceSent"].GetStringValue(), f["nonceAcked"].GetStringValue()
				}
				if e := g.GetErrorState(); e != nil {
					ts.Error = &nackState{Details: e.GetDetails(), Version: e.GetVersionInfo()}
					if e.GetLastUpdateAttempt() != nil {
						at := e.GetLastUpdateAttempt().AsTime()
						ts.Error.At = &at
					}
				}
				ps.Types = append(ps.Types, ts)
			}
			out = append(out, ps)
		}
	}
	slices.SortStableFunc(out, func(a, b proxyStatus) int {
		return cmp.Or(strings.Compare(a.Name, b.Name), strings.Compare(a.Replica, b.Replica))
	})
	return out, nil
}

// statusTable is istioctl proxy-status's table: one row per proxy and replica, a column per
// type some proxy watches (CDS LDS EDS RDS first; a type a proxy does not watch is IGNORED).
func statusTable(statuses []proxyStatus) table {
	var types []string
	seen := map[string]bool{}
	for _, ps := range statuses {
		for _, ts := range ps.Types {
			seen[ts.Type] = true
		}
	}
	for _, s := range xdstype.Core[:4] {
		types = append(types, s.URL)
		delete(seen, s.URL)
	}
	types = append(types, slices.Sorted(maps.Keys(seen))...)
	t := table{header: []string{"NAME", "CLUSTER"}}
	for _, u := range types {
		t.header = append(t.header, xdstype.Short(u))
	}
	t.header = append(t.header, "REPLICA", "VERSION")
	for _, ps := range statuses {
		row := []string{ps.Name, dash(ps.Cluster)}
		for _, u := range types {
			cell := "IGNORED"
			for _, ts := range ps.Types {
				if ts.Type == u {
					cell = ts.Status
				}
			}
			row = append(row, cell)
		}
		version := ps.IstioVersion
		if version == "" && ps.Generator == "grpc" {
			version = "proxyless gRPC"
		}
		t.add(append(row, ps.Replica, dash(version))...)
	}
	return t
}

// proxyDetailTable is one proxy's status per type.
func proxyDetailTable(statuses []proxyStatus) table {
	t := table{header: []string{"NAME", "TYPE", "STATUS", "SENT", "ACKED", "LAST SENT", "REPLICA", "ERROR"}}
	for _, ps := range statuses {
		for _, ts := range ps.Types {
			last := "-"
			if ts.LastSent != nil {
				last = time.Since(*ts.LastSent).Round(time.Second).String() + " ago"
			}
			nack := "-"
			if ts.Error != nil {
				nack = ts.Error.Details
			}
			t.add(ps.Name, xdstype.Short(ts.Type), ts.Status, dash(ts.VersionSent), dash(ts.VersionAcked), last, ps.Replica, nack)
		}
	}
	return t
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func proxyStatusCmd() *cobra.Command {
	var opts xdsOptions
	var format *string
	cmd := &cobra.Command{
		Use:     "proxy-status [PROXY]",
		Aliases: []string{"ps"},
		Short:   "Show whether each proxy has the configuration xds-server last sent it",
		Long: `Asks each xds-server replica (--xds-address, repeatable) which proxies are connected to it
and, for each xDS type a proxy watches, whether it holds what was last sent:
SYNCED (it ACKed the last response), STALE (sent, not ACKed yet), NOT SENT, or NACKED
(it rejected the last response; -o yaml shows its message). Proxyless gRPC clients are listed
with Envoy proxies. With PROXY (<pod>.<namespace>), that proxy's types in detail.

The replicas serve Istio's istio.io/debug/syncz, so istioctl proxy-status --xds-address works
on them too. Over TLS (--cert-dir) the credential must be of the control plane's namespace;
plaintext is answered only on a loopback listener (or one started with --debug-plaintext).`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			answers, err := opts.askAll(cmd.Context(), &discoverygrpc.DiscoveryRequest{TypeUrl: typeSyncz})
			if err != nil {
				return err
			}
			statuses, err := proxyStatuses(answers)
			if err != nil {
				return err
			}
			if len(args) == 0 {
				return writeOutput(cmd.OutOrStdout(), *format, statusTable(statuses), statuses)
			}
			statuses = slices.DeleteFunc(statuses, func(ps proxyStatus) bool { return ps.Name != args[0] })
			if len(statuses) == 0 {
				return fmt.Errorf("proxy %q is not connected to %s (names are <pod>.<namespace>, as listed without an argument)", args[0], strings.Join(opts.addrs, ", "))
			}
			return writeOutput(cmd.OutOrStdout(), *format, proxyDetailTable(statuses), statuses)
		},
	}
	opts.addFlags(cmd)
	format = addOutputFlag(cmd)
	return cmd
}
