package ndsgen

import (
	"hash/fnv"
	"net/netip"
	"strings"
	"sync"

	discoveryv1 "sailplane.dev/proto/discovery/v1"
	"sailplane.dev/services/xds-server/internal/model"
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

// Addresses are one host's auto-allocated pair, at the same offset in both ranges.
type Addresses struct{ V4, V6 netip.Addr }

func (a Addresses) list() []string { return []string{a.V4.String(), a.V6.String()} }

// Allocator gives ServiceEntry hosts without addresses one IPv4 and one IPv6 address each, as
// istiod's IP auto-allocation controller does, without writing them anywhere: a host's
// addresses are its hash's slot in the ranges, so every replica computes the same ones, and
// once given they stay the host's for as long as it exists, whatever other hosts come and go.
// Only when two hosts' hashes collide does the later one take the next free slot, which
// another replica, or this one after a restart, may order differently.
type Allocator struct {
	mu    sync.Mutex
	byKey map[string]uint32 // namespace/hostname -> slot
	owner map[uint32]string
	// memo is the last snapshot assigned, and its result.
	memo    *model.Snapshot
	memoOut map[string]Addresses
}

// NewAllocator returns an allocator with nothing allocated.
func NewAllocator() *Allocator {
	return &Allocator{byKey: map[string]uint32{}, owner: map[uint32]string{}}
}

// Key names a host to the allocator: namespace/hostname, as istiod keys its allocations.
func Key(spec *discoveryv1.Service) string { return spec.GetNamespace() + "/" + spec.GetHostname() }

// Eligible reports whether a service gets auto-allocated addresses (istiod's
// ShouldV2AutoAllocateIP): a ServiceEntry host without addresses, not a wildcard, whose
// resolution is not NONE (the proxy would not know the original destination), and not opted
// out by its label.
func Eligible(spec *discoveryv1.Service) bool {
	if spec.GetRegistry() != "serviceentry" || spec.GetResolution() == discoveryv1.Resolution_NONE ||
		strings.HasPrefix(spec.GetHostname(), "*") || strings.EqualFold(spec.GetLabels()[AutoAllocateLabel], "false") {
		return false
	}
	_, headless := vips(spec)
	return headless
}

// Assign returns the addresses of every eligible host of snap, by Key.
func (a *Allocator) Assign(snap *model.Snapshot) map[string]Addresses {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.memo == snap {
		return a.memoOut
	}
	want := map[string]bool{}
	var keys []string
	for _, h := range snap.Hostnames() {
		if spec := snap.Services[h].Spec; Eligible(spec) {
			k := Key(spec)
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
	out := make(map[string]Addresses, len(keys))
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

func addressesOf(slot uint32) Addresses {
	v4 := v4Prefix.Addr().As4()
	v4[2], v4[3] = byte(slot>>8), byte(slot)
	v6 := v6Prefix.Addr().As16()
	v6[14], v6[15] = byte(slot>>8), byte(slot)
	return Addresses{V4: netip.AddrFrom4(v4), V6: netip.AddrFrom16(v6)}
}
