package model

import (
	"net/netip"
	"strconv"
	"testing"

	discoveryv1 "sailplane.dev/proto/discovery/v1"
)

func seService(host string) *Service {
	return &Service{Spec: &discoveryv1.Service{Hostname: host, Namespace: "ns", Registry: "serviceentry",
		Resolution: discoveryv1.Resolution_DNS}}
}

func snapWith(hosts ...string) *Snapshot {
	s := &Snapshot{Services: map[string]*Service{}}
	for _, h := range hosts {
		s.Services[h] = seService(h)
	}
	return s
}

// TestAllocatorStable: a host keeps its addresses while others come and go, addresses are in
// Istio's ranges and unique, and a fresh allocator (another replica) gives the same ones
// when hashes do not collide.
func TestAllocatorStable(t *testing.T) {
	a := NewAllocator()
	first := a.Assign(snapWith("a.example.com", "b.example.com"))
	second := a.Assign(snapWith("b.example.com", "c.example.com", "d.example.com"))
	if first["ns/b.example.com"] != second["ns/b.example.com"] {
		t.Errorf("b moved: %v then %v", first["ns/b.example.com"], second["ns/b.example.com"])
	}
	if _, ok := second["ns/a.example.com"]; ok {
		t.Error("a kept addresses after it went away")
	}
	seen := map[netip.Addr]string{}
	for k, ad := range second {
		if !v4Prefix.Contains(ad.V4) || !v6Prefix.Contains(ad.V6) {
			t.Errorf("%s: %v outside %v / %v", k, ad, v4Prefix, v6Prefix)
		}
		if o, dup := seen[ad.V4]; dup {
			t.Errorf("%s and %s share %v", k, o, ad.V4)
		}
		seen[ad.V4] = k
	}
	other := NewAllocator().Assign(snapWith("d.example.com"))
	if other["ns/d.example.com"] != second["ns/d.example.com"] {
		t.Errorf("another allocator gives d %v, this one %v", other["ns/d.example.com"], second["ns/d.example.com"])
	}
}

// TestAllocatorCollisions: hosts whose hashes share a slot each get their own, and the one
// that had it keeps it.
func TestAllocatorCollisions(t *testing.T) {
	// Find two keys with the same home slot.
	byHome := map[uint32]string{}
	var x, y string
	for i := 0; x == ""; i++ {
		h := "h" + strconv.Itoa(i) + ".example.com"
		s := home("ns/" + h)
		if o, ok := byHome[s]; ok {
			x, y = o, h
		}
		byHome[s] = h
	}
	a := NewAllocator()
	before := a.Assign(snapWith(y))["ns/"+y]
	both := a.Assign(snapWith(x, y))
	if both["ns/"+y] != before {
		t.Errorf("%s moved from %v to %v when %s came", y, before, both["ns/"+y], x)
	}
	if both["ns/"+x] == both["ns/"+y] {
		t.Errorf("%s and %s share %v", x, y, both["ns/"+x])
	}
}
