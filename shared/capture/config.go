// Package capture is the configuration of an injected pod's traffic capture: which traffic the
// kernel sends to the sidecar, as Istio's istio-init (`pilot-agent istio-iptables`) takes it,
// from its flags or from the pod's `traffic.sidecar.istio.io/*` annotations. The webhook parses
// the annotations with it (a bad value refuses the pod, naming the annotation) and renders the
// init container's flags; the agent's `capture` command parses those flags back and installs
// the rules (sailplane.dev/services/agent/capture). It links nothing but the standard library
// and pflag.
package capture

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// Mode is how inbound connections reach the proxy (sidecar.istio.io/interceptionMode).
type Mode string

const (
	// Redirect NATs inbound connections to the inbound capture port: the proxy sees them from
	// their source but to its own address.
	Redirect Mode = "REDIRECT"
	// TProxy delivers inbound connections unchanged to the proxy through the kernel's
	// transparent proxying (marks and a local route), keeping the original destination too.
	TProxy Mode = "TPROXY"
	// None captures nothing (the webhook then adds no capture).
	None Mode = "NONE"
)

// Well-known ports and ids (Istio's).
const (
	ProxyPort          = 15001 // outbound capture
	InboundCapturePort = 15006
	InboundTunnelPort  = 15008 // HBONE, never captured inbound
	StatusPort         = 15020 // the agent's health and merged metrics
	HealthPort         = 15021 // readiness on gateways
	PrometheusPort     = 15090 // Envoy's own metrics
	DNSPort            = 15053 // the agent's DNS proxy
	ProxyUID           = 1337
	TProxyMark         = 1337
	TProxyRouteTable   = 133
)

// Ports is a port list where "*" means every port.
type Ports struct {
	All  bool
	List []uint16
}

// Ranges is a CIDR list where "*" means every address.
type Ranges struct {
	All  bool
	List []netip.Prefix
}

// Config is what to capture, in the terms of Istio's istio-iptables flags.
type Config struct {
	Mode               Mode
	ProxyPort          uint16 // -p: outbound TCP goes there
	InboundCapturePort uint16 // -z: inbound TCP goes there
	InboundTunnelPort  uint16 // -e: never captured inbound
	ProxyUIDs          []uint32
	ProxyGIDs          []uint32
	TProxyMark         uint32
	TProxyRouteTable   int

	InboundPorts            Ports          // -b: captured inbound ports ("*": all but ExcludeInboundPorts)
	ExcludeInboundPorts     []uint16       // -d: always holds 15090, 15021 and the status port
	OutboundPorts           []uint16       // -q: captured whatever the destination address
	ExcludeOutboundPorts    []uint16       // -o
	OutboundIPRanges        Ranges         // -i: captured destinations
	ExcludeOutboundIPRanges []netip.Prefix // -x
	KubeVirtInterfaces      []string       // -k: traffic arriving there is treated as outbound
	ExcludeInterfaces       []string       // -c: never captured, either way

	// DNS capture (ISTIO_META_DNS_CAPTURE): TCP and UDP port 53 to the agent's DNS proxy, only
	// to DNSServers (resolv.conf's) unless CaptureAllDNS.
	DNS           bool
	CaptureAllDNS bool
	DNSServers    []netip.Addr

	DropInvalid bool // drop conntrack-invalid inbound TCP (out-of-window) instead of resetting
}

// Default is what a pod without annotations gets, as Istio's injection template passes it:
// `-p 15001 -z 15006 -u 1337 -m REDIRECT -i '*' -x ” -b '*' -d 15090,15021,15020`.
func Default() Config {
	return Config{
		Mode:                Redirect,
		ProxyPort:           ProxyPort,
		InboundCapturePort:  InboundCapturePort,
		InboundTunnelPort:   InboundTunnelPort,
		ProxyUIDs:           []uint32{ProxyUID},
		ProxyGIDs:           []uint32{ProxyUID},
		TProxyMark:          TProxyMark,
		TProxyRouteTable:    TProxyRouteTable,
		InboundPorts:        Ports{All: true},
		ExcludeInboundPorts: neverCaptured(StatusPort),
		OutboundIPRanges:    Ranges{All: true},
	}
}

// neverCaptured are the inbound ports of the proxy itself.
func neverCaptured(statusPort uint16) []uint16 {
	ports := []uint16{PrometheusPort, HealthPort}
	if statusPort != 0 && !slices.Contains(ports, statusPort) {
		ports = append(ports, statusPort)
	}
	return ports
}

// Validate checks what parsing cannot: the ports the rules redirect to.
func (c Config) Validate() error {
	switch c.Mode {
	case Redirect, TProxy, None:
	default:
		return fmt.Errorf("interception mode %q: want REDIRECT, TPROXY or NONE", c.Mode)
	}
	for name, p := range map[string]uint16{"proxy port": c.ProxyPort, "inbound capture port": c.InboundCapturePort, "inbound tunnel port": c.InboundTunnelPort} {
		if p == 0 {
			return fmt.Errorf("%s: 0 is not a port", name)
		}
	}
	if len(c.ProxyUIDs) == 0 || len(c.ProxyGIDs) == 0 {
		return fmt.Errorf("the proxy's uid and gid are needed: without them the proxy's own traffic would loop back to it")
	}
	return nil
}

// ParsePorts parses a comma-separated port list; star allows "*" (every port).
func ParsePorts(s string, star bool) (Ports, error) {
	s = strings.TrimSpace(s)
	if s == "*" {
		if !star {
			return Ports{}, fmt.Errorf(`"*" is not allowed here`)
		}
		return Ports{All: true}, nil
	}
	var ports []uint16
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		n, err := strconv.ParseUint(f, 10, 16)
		if err != nil || n == 0 {
			return Ports{}, fmt.Errorf("%q is not a port (1-65535)", f)
		}
		if !slices.Contains(ports, uint16(n)) {
			ports = append(ports, uint16(n))
		}
	}
	return Ports{List: ports}, nil
}

// ParseRanges parses a comma-separated CIDR list; star allows "*" (every address). A bare
// address is refused, as Istio refuses it: a CIDR says which bits it means.
func ParseRanges(s string, star bool) (Ranges, error) {
	s = strings.TrimSpace(s)
	if s == "*" {
		if !star {
			return Ranges{}, fmt.Errorf(`"*" is not allowed here`)
		}
		return Ranges{All: true}, nil
	}
	var out []netip.Prefix
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		p, err := netip.ParsePrefix(f)
		if err != nil {
			return Ranges{}, fmt.Errorf("%q is not a CIDR: %w", f, err)
		}
		// 10.1.2.3/8 is written as 10.0.0.0/8 in the rules: the kernel keeps the masked form.
		p = p.Masked()
		if !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	return Ranges{List: out}, nil
}

// ParseInterfaces parses a comma-separated list of interface names. The names go into rule
// text, so only the characters interface names are made of in practice are accepted.
func ParseInterfaces(s string) ([]string, error) {
	var out []string
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if err := validInterface(f); err != nil {
			return nil, err
		}
		if !slices.Contains(out, f) {
			out = append(out, f)
		}
	}
	return out, nil
}

func validInterface(name string) error {
	if len(name) > 15 {
		return fmt.Errorf("interface %q: longer than 15 characters", name)
	}
	for i, r := range name {
		ok := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' ||
			i > 0 && (r == '-' || r == '_' || r == '.')
		if !ok {
			return fmt.Errorf("interface %q: only letters, digits and -_. (not first) are allowed", name)
		}
	}
	return nil
}

// ParseIDs parses a comma-separated list of numeric uids or gids.
func ParseIDs(s string) ([]uint32, error) {
	var out []uint32
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		n, err := strconv.ParseUint(f, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("%q is not a numeric id", f)
		}
		if !slices.Contains(out, uint32(n)) {
			out = append(out, uint32(n))
		}
	}
	return out, nil
}

// ParseMode parses an interception mode.
func ParseMode(s string) (Mode, error) {
	switch m := Mode(strings.TrimSpace(s)); m {
	case Redirect, TProxy, None:
		return m, nil
	}
	return "", fmt.Errorf("%q: want REDIRECT, TPROXY or NONE", s)
}

func parsePort(s string) (uint16, error) {
	n, err := strconv.ParseUint(strings.TrimSpace(s), 10, 16)
	if err != nil {
		return 0, fmt.Errorf("%q is not a port (0-65535)", s)
	}
	return uint16(n), nil
}

// ExcludeInbound is the inbound exclusion list for user's ports: theirs, then whichever of
// 15090, 15021 and the status port they lack (the injection template's order puts 15090 and
// 15021 first; the order of these rules does not matter, each returns one port).
func ExcludeInbound(user []uint16, statusPort uint16) []uint16 {
	out := slices.Clone(user)
	for _, p := range neverCaptured(statusPort) {
		if !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	return out
}

func joinPorts(ps []uint16) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = strconv.Itoa(int(p))
	}
	return strings.Join(s, ",")
}

func joinIDs(ids []uint32) string {
	s := make([]string, len(ids))
	for i, p := range ids {
		s[i] = strconv.FormatUint(uint64(p), 10)
	}
	return strings.Join(s, ",")
}

func (p Ports) String() string {
	if p.All {
		return "*"
	}
	return joinPorts(p.List)
}

func (r Ranges) String() string {
	if r.All {
		return "*"
	}
	return joinPrefixes(r.List)
}

func joinPrefixes(ps []netip.Prefix) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	return strings.Join(s, ",")
}

// Args are c as the flags of `agent capture` (and of Istio's istio-iptables, which takes the
// same ones): what the webhook puts in the capture init container.
func (c Config) Args() []string {
	args := []string{
		"-p", strconv.Itoa(int(c.ProxyPort)),
		"-z", strconv.Itoa(int(c.InboundCapturePort)),
		"-u", joinIDs(c.ProxyUIDs),
		"-g", joinIDs(c.ProxyGIDs),
		"-m", string(c.Mode),
		"-i", c.OutboundIPRanges.String(),
		"-x", joinPrefixes(c.ExcludeOutboundIPRanges),
		"-b", c.InboundPorts.String(),
		"-d", joinPorts(c.ExcludeInboundPorts),
	}
	if c.InboundTunnelPort != InboundTunnelPort {
		args = append(args, "-e", strconv.Itoa(int(c.InboundTunnelPort)))
	}
	if len(c.OutboundPorts) > 0 {
		args = append(args, "-q", joinPorts(c.OutboundPorts))
	}
	if len(c.ExcludeOutboundPorts) > 0 {
		args = append(args, "-o", joinPorts(c.ExcludeOutboundPorts))
	}
	if len(c.KubeVirtInterfaces) > 0 {
		args = append(args, "-k", strings.Join(c.KubeVirtInterfaces, ","))
	}
	if len(c.ExcludeInterfaces) > 0 {
		args = append(args, "-c", strings.Join(c.ExcludeInterfaces, ","))
	}
	if c.DNS {
		args = append(args, "--redirect-dns")
	}
	if c.CaptureAllDNS {
		args = append(args, "--capture-all-dns")
	}
	if c.DropInvalid {
		args = append(args, "--drop-invalid")
	}
	return args
}
