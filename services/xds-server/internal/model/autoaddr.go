package model

import (
	"hash/fnv"
	"net/netip"
	"strings"
	"sync"

	discoveryv1 "sailplane.dev/proto/discovery/v1"
)

// The ranges istiod allocates from (PILOT_IP_AUTOALLOCATE_IPV4_PREFIX and _IPV6_PREFIX):
// class E, which no pod can reach, and the benchmarking range of RFC 5180.
var (
	v4Prefix = netip.MustParsePrefix("240.240.0.0/16")
	v6Prefix = netip.MustParsePrefix("2001:2::/48")
)

// slots are the offsets into both ranges: the /16 without its first and last address.
const slots = 1<<16 - 2

// AutoAllocateLabel on a ServiceEntry set to "false" opts it out of allocation (Istio's).
const AutoAllocateLabel = "networking.istio.io/enable-autoallocate-ip"

// AutoAddresses are one host's auto-allocated pair, at the same offset in both ranges.
type AutoAddresses struct{ V4, V6 netip.Addr }

// For is the pair's addresses a proxy of those IP families reaches, IPv4 first.
func (a AutoAddresses) For(v4, v6 bool) []string {
	var out []string
	if v4 {
		out = append(out, a.V4.String())
	}
	if v6 {
		out = append(out, a.V6.String())
	}
	return out
}

// Allocator gives ServiceEntry hosts without addresses one IPv4 and one IPv6 address each, as
// istiod's IP auto-allocation controller does, without writing them anywhere: a host's
// addresses are its hash's slot in the ranges, so every replica computes the same ones, and
// once given they stay the host's for as long as it exists, whatever other hosts come and go.
// Only when two hosts' hashes collide does the later one take the next free slot, which
// another replica, or this one after a restart, may order differently.
type Allocator struct {
	// byDefault is istiod's PILOT_ENABLE_IP_AUTOALLOCATE (on by default): every proxy that
	// captures DNS uses auto-allocated addresses; off, only those that also set
	// DNS_AUTO_ALLOCATE do.
	byDefault bool

	mu    sync.Mutex
	byKey map[string]uint32 // namespace/hostname -> slot
	owner map[uint32]string
	// memo is the last snapshot assigned, and its result.
	memo    *Snapshot
	memoOut map[string]AutoAddresses
}

// NewAllocator returns an allocator with nothing allocated, whose addresses every proxy that
// captures DNS uses (istiod's default).
func NewAllocator() *Allocator {
	return &Allocator{byDefault: true, byKey: map[string]uint32{}, owner: map[uint32]string{}}
}

// OnlyWhenAsked makes the addresses serve only proxies whose metadata sets DNS_AUTO_ALLOCATE
// (istiod with PILOT_ENABLE_IP_AUTOALLOCATE=false).
func (a *Allocator) OnlyWhenAsked() *Allocator {
	a.byDefault = false
	return a
}

// Uses reports whether proxy p uses auto-allocated addresses (istiod's
// nodeUsesAutoallocatedIPs): its DNS is captured, so the names it resolves lead to them.
func (a *Allocator) Uses(p *Proxy) bool {
	return a != nil && p.DNSCapture && (a.byDefault || p.DNSAutoAllocate)
}

// For returns the addresses of every eligible host of snap, by Key, when proxy p uses them;
// nil otherwise.
func (a *Allocator) For(snap *Snapshot, p *Proxy) map[string]AutoAddresses {
	if !a.Uses(p) {
		return nil
	}
	return a.Assign(snap)
}

// AutoAddressKey names a host to the allocator: namespace/hostname, as istiod keys its allocations.
func AutoAddressKey(spec *discoveryv1.Service) string {
	return spec.GetNamespace() + "/" + spec.GetHostname()
}

// AutoAllocatable reports whether a service gets auto-allocated addresses (istiod's
// ShouldV2AutoAllocateIP): a ServiceEntry host without addresses, not a wildcard, whose
// resolution is not NONE (the proxy would not know the original destination), and not opted
// out by its label.
func AutoAllocatable(spec *discoveryv1.Service) bool {
	if spec.GetRegistry() != "serviceentry" || spec.GetResolution() == discoveryv1.Resolution_NONE ||
		strings.HasPrefix(spec.GetHostname(), "*") || strings.EqualFold(spec.GetLabels()[AutoAllocateLabel], "false") {
		return false
	}
	addrs := spec.GetAddresses()
	return len(addrs) == 0 || addrs[0] == "" || addrs[0] == "0.0.0.0"
}

// Assign returns the addresses of every eligible host of snap, by Key.
func (a *Allocator) Assign(snap *Snapshot) map[string]AutoAddresses {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.memo == snap {
		return a.memoOut
	}
	want := map[string]bool{}
	var keys []string
	for _, h := range snap.Hostnames() {
		if spec := snap.Services[h].Spec; AutoAllocatable(spec) {
			k := AutoAddressKey(spec)
			want[k] = true
			keys = append(keys, k)
		}
	}
	// Free what is gone first, so that the slots can serve new hosts.
	for k, s := range a.byKey {
		if !want[k] {
			delete(a.byKey, k)
			delete(a.owner, s)
		}
	}
	out := make(map[string]AutoAddresses, len(keys))
	for _, k := range keys {
		s, ok := a.byKey[k]
		if !ok {
			if len(a.owner) >= slots {
				continue // exhausted: the host stays without address, as in istiod
			}
			s = home(k)
			for a.owner[s] != "" {
				s = s%slots + 1
			}
			a.byKey[k], a.owner[s] = s, k
		}
		out[k] = addressesOf(s)
	}
	a.memo, a.memoOut = snap, out
	return out
}

// home is a key's preferred slot, 1..slots.
func home(key string) uint32 {
	h := fnv.New32a()
	_, _ = h.Write([]byte(key))
	return h.Sum32()%slots + 1
}

func addressesOf(slot uint32) AutoAddresses {
	v4 := v4Prefix.Addr().As4()
	v4[2], v4[3] = byte(slot>>8), byte(slot)
	v6 := v6Prefix.Addr().As16()
	v6[14], v6[15] = byte(slot>>8), byte(slot)
	return AutoAddresses{V4: netip.AddrFrom4(v4), V6: netip.AddrFrom16(v6)}
}
