package capture

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"

	"github.com/spf13/pflag"
)

// Flags are Istio's istio-iptables flags (same letters and names, so an istio-init command
// line works unchanged), with the injected defaults: run with none, they capture what a pod
// without annotations gets.
type Flags struct {
	proxyPort, inboundPort, tunnelPort      string
	uid, gid, mode, mark, routeTable        string
	inboundPorts, excludeInbound            string
	outboundPorts, excludeOutbound          string
	ranges, excludeRanges                   string
	kubevirt, excludeIfaces, dnsServers     string
	statusPort                              string
	redirectDNS, captureAllDNS, dropInvalid bool
}

// AddFlags registers the flags on fs.
func (f *Flags) AddFlags(fs *pflag.FlagSet) {
	fs.StringVarP(&f.proxyPort, "envoy-port", "p", "15001", "port to which outbound TCP is redirected")
	fs.StringVarP(&f.inboundPort, "inbound-capture-port", "z", "15006", "port to which inbound TCP is redirected")
	fs.StringVarP(&f.tunnelPort, "inbound-tunnel-port", "e", "15008", "inbound port never captured (HBONE)")
	fs.StringVarP(&f.uid, "proxy-uid", "u", "1337", "comma-separated uids whose traffic is never captured (the proxy's)")
	fs.StringVarP(&f.gid, "proxy-gid", "g", "", "comma-separated gids whose traffic is never captured (default: the uids)")
	fs.StringVarP(&f.mode, "istio-inbound-interception-mode", "m", "REDIRECT", "inbound interception: REDIRECT, TPROXY or NONE")
	fs.StringVarP(&f.mark, "istio-inbound-tproxy-mark", "t", "1337", "TPROXY packet mark")
	fs.StringVarP(&f.routeTable, "istio-inbound-tproxy-route-table", "r", "133", "TPROXY routing table")
	fs.StringVarP(&f.inboundPorts, "istio-inbound-ports", "b", "*", `inbound ports captured, "*" for all, "" for none`)
	fs.StringVarP(&f.excludeInbound, "istio-local-exclude-ports", "d", "15090,15021,15020", "inbound ports not captured (15090, 15021 and the status port always are not)")
	fs.StringVarP(&f.outboundPorts, "istio-outbound-ports", "q", "", "outbound ports captured whatever the destination")
	fs.StringVarP(&f.excludeOutbound, "istio-local-outbound-ports-exclude", "o", "", "outbound ports not captured")
	fs.StringVarP(&f.ranges, "istio-service-cidr", "i", "*", `outbound CIDRs captured, "*" for all, "" for none`)
	fs.StringVarP(&f.excludeRanges, "istio-service-exclude-cidr", "x", "", "outbound CIDRs not captured")
	fs.StringVarP(&f.kubevirt, "kube-virt-interfaces", "k", "", "interfaces whose inbound traffic is treated as outbound")
	fs.StringVarP(&f.excludeIfaces, "istio-exclude-interfaces", "c", "", "interfaces never captured")
	fs.StringVar(&f.statusPort, "status-port", "15020", "the agent's status port, never captured inbound (0: none)")
	fs.BoolVar(&f.redirectDNS, "redirect-dns", envBool("ISTIO_META_DNS_CAPTURE") || envBool("REDIRECT_DNS"), "capture DNS (port 53) to the agent's DNS proxy on 15053 (env ISTIO_META_DNS_CAPTURE)")
	fs.BoolVar(&f.captureAllDNS, "capture-all-dns", envBool("CAPTURE_ALL_DNS"), "capture DNS to any server, not only resolv.conf's")
	fs.StringVar(&f.dnsServers, "dns-servers", "", "DNS servers whose traffic is captured (default: resolv.conf's)")
	fs.BoolVar(&f.dropInvalid, "drop-invalid", envBool("INVALID_DROP"), "drop conntrack-invalid packets instead of resetting the connection")
}

func envBool(name string) bool {
	b, _ := strconv.ParseBool(os.Getenv(name))
	return b
}

// FlagError is a capture flag whose value does not parse.
type FlagError struct {
	Flag, Value string
	Err         error
}

func (e *FlagError) Error() string {
	return fmt.Sprintf("flag --%s: invalid value %q: %v", e.Flag, e.Value, e.Err)
}

func (e *FlagError) Unwrap() error { return e.Err }

// DNSServersSet reports whether --dns-servers was given (else the caller reads resolv.conf).
func (f *Flags) DNSServersSet() bool { return strings.TrimSpace(f.dnsServers) != "" }

// Config parses the flags.
func (f *Flags) Config() (Config, error) {
	c := Default()
	var errs []error
	bad := func(flag, value string, err error) {
		errs = append(errs, &FlagError{Flag: flag, Value: value, Err: err})
	}
	port := func(flag, v string, dst *uint16) {
		p, err := parsePort(v)
		if err == nil && p == 0 {
			err = errors.New("0 is not a port")
		}
		if err != nil {
			bad(flag, v, err)
			return
		}
		*dst = p
	}
	port("envoy-port", f.proxyPort, &c.ProxyPort)
	port("inbound-capture-port", f.inboundPort, &c.InboundCapturePort)
	port("inbound-tunnel-port", f.tunnelPort, &c.InboundTunnelPort)
	var err error
	if c.ProxyUIDs, err = ParseIDs(f.uid); err != nil || len(c.ProxyUIDs) == 0 {
		bad("proxy-uid", f.uid, orEmpty(err))
	}
	c.ProxyGIDs = c.ProxyUIDs
	if strings.TrimSpace(f.gid) != "" {
		if c.ProxyGIDs, err = ParseIDs(f.gid); err != nil {
			bad("proxy-gid", f.gid, err)
		}
	}
	if c.Mode, err = ParseMode(f.mode); err != nil {
		bad("istio-inbound-interception-mode", f.mode, err)
	}
	if m, err := strconv.ParseUint(f.mark, 10, 32); err != nil || m == 0 {
		bad("istio-inbound-tproxy-mark", f.mark, errors.New("want a non-zero number"))
	} else {
		c.TProxyMark = uint32(m)
	}
	if t, err := strconv.Atoi(f.routeTable); err != nil || t <= 0 || t > 252 {
		bad("istio-inbound-tproxy-route-table", f.routeTable, errors.New("want a routing table number, 1-252"))
	} else {
		c.TProxyRouteTable = t
	}
	if c.InboundPorts, err = ParsePorts(f.inboundPorts, true); err != nil {
		bad("istio-inbound-ports", f.inboundPorts, err)
	}
	status, err := parsePort(f.statusPort)
	if err != nil {
		bad("status-port", f.statusPort, err)
	}
	if p, err := ParsePorts(f.excludeInbound, false); err != nil {
		bad("istio-local-exclude-ports", f.excludeInbound, err)
	} else {
		c.ExcludeInboundPorts = ExcludeInbound(p.List, status)
	}
	if p, err := ParsePorts(f.outboundPorts, false); err != nil {
		bad("istio-outbound-ports", f.outboundPorts, err)
	} else {
		c.OutboundPorts = p.List
	}
	if p, err := ParsePorts(f.excludeOutbound, false); err != nil {
		bad("istio-local-outbound-ports-exclude", f.excludeOutbound, err)
	} else {
		c.ExcludeOutboundPorts = p.List
	}
	if c.OutboundIPRanges, err = ParseRanges(f.ranges, true); err != nil {
		bad("istio-service-cidr", f.ranges, err)
	}
	if r, err := ParseRanges(f.excludeRanges, false); err != nil {
		bad("istio-service-exclude-cidr", f.excludeRanges, err)
	} else {
		c.ExcludeOutboundIPRanges = r.List
	}
	if c.KubeVirtInterfaces, err = ParseInterfaces(f.kubevirt); err != nil {
		bad("kube-virt-interfaces", f.kubevirt, err)
	}
	if c.ExcludeInterfaces, err = ParseInterfaces(f.excludeIfaces); err != nil {
		bad("istio-exclude-interfaces", f.excludeIfaces, err)
	}
	c.DNS, c.CaptureAllDNS, c.DropInvalid = f.redirectDNS, f.captureAllDNS, f.dropInvalid
	if f.DNSServersSet() {
		for _, s := range strings.Split(f.dnsServers, ",") {
			a, err := netip.ParseAddr(strings.TrimSpace(s))
			if err != nil {
				bad("dns-servers", f.dnsServers, err)
				break
			}
			c.DNSServers = append(c.DNSServers, a.Unmap())
		}
	}
	if err := errors.Join(errs...); err != nil {
		return Config{}, err
	}
	return c, c.Validate()
}

func orEmpty(err error) error {
	if err == nil {
		return errors.New("empty")
	}
	return err
}
