package xds

import (
	"context"
	"encoding/json"
	"maps"
	"slices"
	"strings"
	"testing"

	adminv3 "github.com/envoyproxy/go-control-plane/envoy/admin/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	statusv3 "github.com/envoyproxy/go-control-plane/envoy/service/status/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
)

// TestWatchStatus: a type's status follows its last response and the client's answers to it,
// as istiod computes it: nothing sent is NOT_SENT, the last response ACKed SYNCED, sent and not
// answered (or an older one answered) STALE, and a NACK ERROR until the client ACKs again.
func TestWatchStatus(t *testing.T) {
	type event struct {
		send string // nonce sent
		ack  string // nonce ACKed
		nack string // nonce NACKed
	}
	rejected := status.New(codes.InvalidArgument, "cluster outbound|80||a: bad")
	for _, tc := range []struct {
		name   string
		events []event
		want   statusv3.ConfigStatus
	}{
		{"nothing sent", nil, statusv3.ConfigStatus_NOT_SENT},
		{"sent, not answered", []event{{send: "1"}}, statusv3.ConfigStatus_STALE},
		{"sent and ACKed", []event{{send: "1"}, {ack: "1"}}, statusv3.ConfigStatus_SYNCED},
		{"newer response not answered yet", []event{{send: "1"}, {ack: "1"}, {send: "2"}}, statusv3.ConfigStatus_STALE},
		{"older response ACKed after a newer was sent", []event{{send: "1"}, {send: "2"}, {ack: "1"}}, statusv3.ConfigStatus_STALE},
		{"NACKed", []event{{send: "1"}, {ack: "1"}, {send: "2"}, {nack: "2"}}, statusv3.ConfigStatus_ERROR},
		{"NACK then a new response", []event{{send: "1"}, {nack: "1"}, {send: "2"}}, statusv3.ConfigStatus_ERROR},
		{"NACK then a new response ACKed", []event{{send: "1"}, {nack: "1"}, {send: "2"}, {ack: "2"}}, statusv3.ConfigStatus_SYNCED},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ss, stream := newSyncStatus(), StreamInfo{ID: 1}
			sent := map[string]Response{}
			for _, ev := range tc.events {
				switch {
				case ev.send != "":
					sent[ev.send] = Response{Stream: stream, TypeURL: cds, Nonce: ev.send, Version: "v" + ev.send}
					ss.Responded(sent[ev.send])
				case ev.ack != "":
					ss.Answered(Answer{Stream: stream, Response: sent[ev.ack]})
				case ev.nack != "":
					ss.Answered(Answer{Stream: stream, Response: sent[ev.nack], Err: rejected})
				}
			}
			ws := ss.of(stream.ID)[cds]
			if got := ws.configStatus(); got != tc.want {
				t.Fatalf("status %v, want %v (%+v)", got, tc.want, ws)
			}
			if tc.want == statusv3.ConfigStatus_ERROR && ws.nackError != rejected.Message() {
				t.Errorf("NACK detail %q, want %q", ws.nackError, rejected.Message())
			}
		})
	}
}

func allowDebug(context.Context, string) error { return nil }

// debugClient asks a server for debug types over state-of-the-world ADS, as istioctl does.
type debugClient struct{ *sotw }

func newDebugClient(t *testing.T, addr string) debugClient {
	md, _ := structpb.NewStruct(map[string]any{"GENERATOR": "event", "NAMESPACE": "istio-system"})
	return debugClient{newSotW(t, addr, &corev3.Node{Id: "sidecar~~istioctl.istio-system~istio-system.svc.cluster.local", Metadata: md})}
}

// syncz is the sync status of every proxy, by name.
func (d debugClient) syncz() (map[string]*statusv3.ClientConfig, *discoverygrpc.DiscoveryResponse) {
	d.t.Helper()
	d.send(&discoverygrpc.DiscoveryRequest{TypeUrl: TypeSyncz, ResponseNonce: "not one of the server's"})
	resp := d.recvType(TypeSyncz)
	out := map[string]*statusv3.ClientConfig{}
	for _, a := range resp.GetResources() {
		cc := &statusv3.ClientConfig{}
		if err := a.UnmarshalTo(cc); err != nil {
			d.t.Fatal(err)
		}
		out[cc.GetNode().GetId()] = cc
	}
	return out, resp
}

func (d debugClient) configDump(proxy string) []*anypb.Any {
	d.t.Helper()
	d.send(&discoverygrpc.DiscoveryRequest{TypeUrl: TypeConfigDump, ResourceNames: []string{proxy}})
	return d.recvType(TypeConfigDump).GetResources()
}

func statuses(cc *statusv3.ClientConfig) map[string]string {
	out := map[string]string{}
	for _, g := range cc.GetGenericXdsConfigs() {
		out[short(g.GetTypeUrl())] = g.GetConfigStatus().String()
	}
	return out
}

// TestSyncz: the sync status of an Envoy-like SotW client and a proxyless delta client, as a
// debug client (not listed itself) sees it through each step: not sent, sent, ACKed, NACKed.
func TestSyncz(t *testing.T) {
	e := newEnv(t, Options{DebugAccess: allowDebug, Replica: "xds-server-0", Version: "1.2.3"})
	envoy := newSotW(t, e.addr, node("envoy", "demo", false))
	grpcClient := newDelta(t, e.addr, node("grpc", "demo", true))
	debug := newDebugClient(t, e.addr)

	// Asked before the server has a snapshot: nothing sent.
	envoy.subscribe(cds)
	grpcClient.send(&discoverygrpc.DeltaDiscoveryRequest{TypeUrl: lds})
	waitUntil(t, func() bool { return e.srv.Connections() == 2 })
	got, resp := debug.syncz()
	if len(got) != 2 || got["envoy.demo"] == nil || got["grpc.demo"] == nil {
		t.Fatalf("syncz lists %v, want envoy.demo and grpc.demo only", slices.Sorted(maps.Keys(got)))
	}
	for name, cc := range got {
		if s := statuses(cc); len(s) != 1 || s[map[string]string{"envoy.demo": "Cluster", "grpc.demo": "Listener"}[name]] != "NOT_SENT" {
			t.Errorf("%s before any snapshot: %v, want its one type NOT_SENT", name, s)
		}
	}
	var cp struct {
		Component, ID string
		Info          struct{ Version string }
	}
	if err := json.Unmarshal([]byte(resp.GetControlPlane().GetIdentifier()), &cp); err != nil ||
		cp.Component != ComponentName || cp.ID != "xds-server-0" || cp.Info.Version != "1.2.3" {
		t.Errorf("control plane identifier %q (%v), want xds-server, xds-server-0, 1.2.3", resp.GetControlPlane().GetIdentifier(), err)
	}
	md := got["grpc.demo"].GetNode().GetMetadata().GetFields()
	if md["NAMESPACE"].GetStringValue() != "demo" || md["CLUSTER_ID"].GetStringValue() != "Kubernetes" || md["GENERATOR"].GetStringValue() != "grpc" {
		t.Errorf("node metadata %v", md)
	}

	// Sent, not yet answered: STALE; answered: SYNCED.
	e.update(baseMesh()...)
	sent := envoy.recvRaw()
	grpcClient.recv()
	got, _ = debug.syncz()
	if s := statuses(got["envoy.demo"]); s["Cluster"] != "STALE" {
		t.Errorf("envoy after an unanswered response: %v, want Cluster STALE", s)
	}
	envoy.send(&discoverygrpc.DiscoveryRequest{TypeUrl: cds, ResponseNonce: sent.GetNonce(), VersionInfo: sent.GetVersionInfo()})
	envoy.drain()
	grpcClient.drain()
	got, _ = debug.syncz()
	if s := statuses(got["envoy.demo"]); s["Cluster"] != "SYNCED" {
		t.Errorf("envoy after its ACK: %v, want Cluster SYNCED", s)
	}
	if s := statuses(got["grpc.demo"]); s["Listener"] != "SYNCED" {
		t.Errorf("gRPC client after its ACK: %v, want Listener SYNCED", s)
	}
	g := got["envoy.demo"].GetGenericXdsConfigs()[0]
	if g.GetVersionInfo() != sent.GetVersionInfo() || g.GetLastUpdated() == nil {
		t.Errorf("envoy's clusters: version %q updated %v, want %q and a time", g.GetVersionInfo(), g.GetLastUpdated(), sent.GetVersionInfo())
	}
	var detail structpb.Struct
	if err := g.GetXdsConfig().UnmarshalTo(&detail); err != nil || detail.GetFields()["versionAcked"].GetStringValue() != sent.GetVersionInfo() ||
		detail.GetFields()["nonceAcked"].GetStringValue() != sent.GetNonce() {
		t.Errorf("envoy's clusters detail %v (%v), want version and nonce acked %s, %s", detail.AsMap(), err, sent.GetVersionInfo(), sent.GetNonce())
	}

	// NACKed: ERROR with the client's message, until a new version is ACKed.
	e.update(destinationRule("demo", "a", "a.demo"))
	bad := envoy.recvRaw()
	envoy.send(nack(bad, nil))
	envoy.drain()
	got, _ = debug.syncz()
	g = got["envoy.demo"].GetGenericXdsConfigs()[0]
	if g.GetConfigStatus() != statusv3.ConfigStatus_ERROR || g.GetErrorState().GetDetails() != "rejected by test" ||
		g.GetErrorState().GetVersionInfo() != bad.GetVersionInfo() {
		t.Errorf("envoy after its NACK: %v %v, want ERROR, rejected by test, version %s", g.GetConfigStatus(), g.GetErrorState(), bad.GetVersionInfo())
	}
	e.update(destinationRule("demo", "b", "b.demo"))
	envoy.recvType(cds)
	envoy.drain()
	got, _ = debug.syncz()
	if s := statuses(got["envoy.demo"]); s["Cluster"] != "SYNCED" {
		t.Errorf("envoy after ACKing a new version: %v, want Cluster SYNCED", s)
	}

	// The answer's ACK is not a new request.
	if extra := debug.drain(); len(extra) != 0 {
		t.Errorf("debug client got %v after ACKing", types_(extra))
	}
}

// dumpSection unmarshals the section of type T from a config dump's resources.
func dumpSection[T proto.Message](t *testing.T, res []*anypb.Any, m T) T {
	t.Helper()
	for _, a := range res {
		if a.MessageIs(m) {
			if err := a.UnmarshalTo(m); err != nil {
				t.Fatal(err)
			}
			return m
		}
	}
	t.Fatalf("no %T in the config dump", m)
	return m
}

// TestConfigDump: the dump is what the proxy holds: what it ACKed, not a version it NACKed; of
// a delta client that reconnects, the versions it already had.
func TestConfigDump(t *testing.T) {
	e := newEnv(t, Options{DebugAccess: allowDebug}, baseMesh()...)
	debug := newDebugClient(t, e.addr)
	envoy := newSotW(t, e.addr, node("envoy", "demo", false))
	envoy.subscribe(cds)
	held := envoy.recvType(cds)
	envoy.subscribe(eds, cluster("a.demo"))
	envoy.recvType(eds)
	envoy.drain()

	clusters := func(res []*anypb.Any) map[string]string {
		t.Helper()
		out := map[string]string{}
		for _, dc := range dumpSection(t, res, &adminv3.ClustersConfigDump{}).GetDynamicActiveClusters() {
			c := &clusterv3.Cluster{}
			if err := dc.GetCluster().UnmarshalTo(c); err != nil {
				t.Fatal(err)
			}
			out[c.GetName()] = c.GetLbPolicy().String() + "@" + dc.GetVersionInfo()
		}
		return out
	}
	before := clusters(debug.configDump("envoy.demo"))
	if len(before) != 2 || !strings.HasPrefix(before[cluster("a.demo")], "ROUND_ROBIN@") {
		t.Fatalf("clusters dumped %v, want a.demo and b.demo, round robin", before)
	}
	res := debug.configDump("sidecar~10.0.0.1~envoy.demo~demo.svc.cluster.local") // the node ID works too
	if eps := dumpSection(t, res, &adminv3.EndpointsConfigDump{}).GetDynamicEndpointConfigs(); len(eps) != 1 {
		t.Errorf("endpoints dumped %v, want a.demo's", eps)
	}
	if len(held.GetResources()) != 2 {
		t.Fatalf("clusters sent %d", len(held.GetResources()))
	}

	// A NACKed update is not held: the dump keeps the previous clusters.
	e.update(destinationRule("demo", "a", "a.demo"))
	envoy.send(nack(envoy.recvRaw(), nil))
	envoy.drain()
	if after := clusters(debug.configDump("envoy.demo")); !maps.Equal(after, before) {
		t.Errorf("after a NACK the dump shows %v, want what was held: %v", after, before)
	}
	// An ACKed one is.
	e.update(destinationRule("demo", "b", "b.demo"))
	envoy.recvType(cds)
	envoy.drain()
	if after := clusters(debug.configDump("envoy.demo")); !strings.HasPrefix(after[cluster("a.demo")], "RING_HASH@") || after[cluster("a.demo")] == before[cluster("a.demo")] {
		t.Errorf("after an ACK the dump shows %v, want both clusters ring hash", after)
	}

	// A delta client reconnecting with what it had: the versions still current are dumped
	// with their content, before anything is sent again.
	first := newDelta(t, e.addr, node("grpc", "demo", true))
	first.send(&discoverygrpc.DeltaDiscoveryRequest{TypeUrl: cds})
	first.recvType(cds)
	first.drain()
	versions := first.have[cds]
	again := newDelta(t, e.addr, node("grpc2", "demo", true))
	again.send(&discoverygrpc.DeltaDiscoveryRequest{TypeUrl: cds, InitialResourceVersions: versions})
	again.drain()
	if got := clusters(debug.configDump("grpc2.demo")); len(got) != len(versions) {
		t.Errorf("reconnected delta client: dump %v, want its %d clusters", got, len(versions))
	}

	// Not connected here: an empty answer (another replica may have it).
	if res := debug.configDump("nobody.demo"); len(res) != 0 {
		t.Errorf("dump of an unknown proxy: %d resources, want none", len(res))
	}

	// A debug client that then asks for clusters is a proxy too, and may dump itself.
	debug.subscribe(cds)
	debug.recvType(cds)
	if got := clusters(debug.configDump("istioctl.istio-system")); len(got) != 2 {
		t.Errorf("a stream dumping itself: %v, want its 2 clusters", got)
	}
}

// TestDebugAccess: debug requests are refused with the access rule's error (and the stream
// ends), or with PermissionDenied when the server has none; one resource name is required for
// a config dump.
func TestDebugAccess(t *testing.T) {
	for _, tc := range []struct {
		name   string
		access func(context.Context, string) error
		req    *discoverygrpc.DiscoveryRequest
		want   codes.Code
	}{
		{"no access rule", nil, &discoverygrpc.DiscoveryRequest{TypeUrl: TypeSyncz}, codes.PermissionDenied},
		{"refused", func(context.Context, string) error { return status.Error(codes.Unauthenticated, "who are you") },
			&discoverygrpc.DiscoveryRequest{TypeUrl: TypeSyncz}, codes.Unauthenticated},
		{"config dump without a name", allowDebug, &discoverygrpc.DiscoveryRequest{TypeUrl: TypeConfigDump}, codes.InvalidArgument},
		{"unknown debug type", allowDebug, &discoverygrpc.DiscoveryRequest{TypeUrl: DebugTypePrefix + "adsz"}, codes.Unimplemented},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, Options{DebugAccess: tc.access}, baseMesh()...)
			d := newDebugClient(t, e.addr)
			d.send(tc.req)
			_, err := d.s.Recv()
			if status.Code(err) != tc.want {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
		})
	}
}

// TestRedactSecret: a dumped secret keeps its certificate, never its key material.
func TestRedactSecret(t *testing.T) {
	key := []byte("-----BEGIN PRIVATE KEY-----\nsecret\n-----END PRIVATE KEY-----")
	inline := func(b []byte) *corev3.DataSource {
		return &corev3.DataSource{Specifier: &corev3.DataSource_InlineBytes{InlineBytes: b}}
	}
	for _, s := range []*tlsv3.Secret{
		{Name: "default", Type: &tlsv3.Secret_TlsCertificate{TlsCertificate: &tlsv3.TlsCertificate{
			CertificateChain: inline([]byte("CERT")), PrivateKey: inline(key), Password: inline(key), Pkcs12: inline(key)}}},
		{Name: "generic", Type: &tlsv3.Secret_GenericSecret{GenericSecret: &tlsv3.GenericSecret{
			Secret: inline(key), Secrets: map[string]*corev3.DataSource{"k": inline(key)}}}},
	} {
		a, err := anypb.New(s)
		if err != nil {
			t.Fatal(err)
		}
		dump := buildConfigDump(map[string][]heldResource{"type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret": {{name: s.GetName(), version: "1", res: a}}}, testLogger(t))
		b, err := proto.Marshal(dump)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(b), "secret") {
			t.Errorf("%s: key material in the config dump", s.GetName())
		}
		got := dumpSection(t, dump.GetConfigs(), &adminv3.SecretsConfigDump{}).GetDynamicActiveSecrets()
		if len(got) != 1 || got[0].GetName() != s.GetName() {
			t.Fatalf("%s: dumped %v", s.GetName(), got)
		}
		if s.GetTlsCertificate() != nil && !strings.Contains(string(b), "CERT") {
			t.Errorf("%s: certificate chain left out", s.GetName())
		}
	}
}
