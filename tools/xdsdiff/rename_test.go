package xdsdiff

import (
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// TestRenameAddresses: two sides that gave one host different addresses agree once each is
// renamed after its own table — in names, socket addresses and domains nested in an Any — and
// an address is renamed only whole.
func TestRenameAddresses(t *testing.T) {
	listener := func(ip string) *anypb.Any {
		hcm, _ := anypb.New(&hcmv3.HttpConnectionManager{StatPrefix: "outbound_" + ip + "_80",
			RouteSpecifier: &hcmv3.HttpConnectionManager_RouteConfig{RouteConfig: &routev3.RouteConfiguration{
				VirtualHosts: []*routev3.VirtualHost{{Name: "a", Domains: []string{"a.example", ip, "[2001:2::f0f0:1]", ip + "0"}}}}}})
		l, _ := anypb.New(&listenerv3.Listener{Name: ip + "_80",
			Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{Address: ip}}},
			FilterChains: []*listenerv3.FilterChain{{Filters: []*listenerv3.Filter{{Name: "hcm",
				ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: hcm}}}}}})
		return l
	}
	istiod := Snapshot{ListenerType: {listener("240.240.0.1")}}
	ours := Snapshot{ListenerType: {listener("240.240.9.9")}}
	if d, _, _ := Compare(istiod, ours); len(d) == 0 {
		t.Fatal("different addresses compare equal before renaming")
	}
	ri, err := RenameAddresses(istiod, map[string]string{"240.240.0.1": "auto(a)", "2001:2::f0f0:1": "auto6(a)"})
	if err != nil {
		t.Fatal(err)
	}
	ro, err := RenameAddresses(ours, map[string]string{"240.240.9.9": "auto(a)", "2001:2::f0f0:1": "auto6(a)"})
	if err != nil {
		t.Fatal(err)
	}
	d, _, err := Compare(ri, ro)
	if err != nil {
		t.Fatal(err)
	}
	// What remains differs on purpose: the longer addresses, which are not the host's.
	l := &listenerv3.Listener{}
	if err := ri[ListenerType][0].UnmarshalTo(l); err != nil {
		t.Fatal(err)
	}
	if l.GetName() != "auto(a)_80" || l.GetAddress().GetSocketAddress().GetAddress() != "auto(a)" {
		t.Errorf("listener %q at %q, want renamed", l.GetName(), l.GetAddress().GetSocketAddress().GetAddress())
	}
	hcm := &hcmv3.HttpConnectionManager{}
	if err := l.GetFilterChains()[0].GetFilters()[0].GetTypedConfig().UnmarshalTo(hcm); err != nil {
		t.Fatal(err)
	}
	want := []string{"a.example", "auto(a)", "[auto6(a)]", "240.240.0.10"}
	if got := hcm.GetRouteConfig().GetVirtualHosts()[0].GetDomains(); !proto.Equal(&routev3.VirtualHost{Domains: got},
		&routev3.VirtualHost{Domains: want}) {
		t.Errorf("domains %v, want %v", got, want)
	}
	if len(d) != 1 {
		t.Errorf("after renaming, %d differences, want only the longer address's: %v", len(d), d)
	}
	if _, err := RenameAddresses(istiod, map[string]string{"not-an-ip": "x"}); err == nil {
		t.Error("renaming a non-address accepted")
	}
	// The input is left as it was.
	if l2 := (&listenerv3.Listener{}); istiod[ListenerType][0].UnmarshalTo(l2) != nil || l2.GetName() != "240.240.0.1_80" {
		t.Error("RenameAddresses modified its input")
	}
}
