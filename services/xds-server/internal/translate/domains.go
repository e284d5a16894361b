package translate

import (
	"net/netip"
	"strconv"
	"strings"

	discoveryv1 "sailplane.dev/proto/discovery/v1"
)

// Domains are the Host headers (or gRPC target names) that reach svc, as istiod writes them
// for a virtual host, without ports: the FQDN and its absolute form with a trailing dot, the
// short names a client in DNS domain proxyDomain may use, a "*." form of each for a Kubernetes
// headless service (its pods' names), and the VIPs (IPv6 in brackets).
func Domains(svc *discoveryv1.Service, proxyDomain string) []string {
	host := svc.GetHostname()
	out := []string{host}
	if _, err := netip.ParseAddr(host); err != nil {
		out = append(out, host+".")
	}
	out = append(out, AltHosts(host, proxyDomain)...)
	if svc.GetResolution() == discoveryv1.Resolution_NONE && svc.GetRegistry() == "kubernetes" {
		for _, d := range out {
			out = append(out, "*."+d)
		}
	}
	for _, a := range svc.GetAddresses() {
		if a == "" || a == "0.0.0.0" {
			continue
		}
		out = append(out, HostLiteral(a))
	}
	return out
}

// HostLiteral is an IP as a Host header carries it: IPv6 in brackets.
func HostLiteral(ip string) string {
	if strings.Contains(ip, ":") {
		return "[" + ip + "]"
	}
	return ip
}

// AltHosts are the shorter names of host a client in DNS domain proxyDomain may use: for a
// Kubernetes proxy ("<ns>.svc.<suffix>") and a service of the same cluster, "name",
// "name.ns.svc" and "name.ns" from the service's namespace, "name.ns" and "name.ns.svc" from
// elsewhere; otherwise the part of the host not shared with the proxy's domain.
func AltHosts(host, proxyDomain string) []string {
	if i := strings.Index(proxyDomain, ".svc."); i >= 0 {
		ih := strings.Index(host, ".svc.")
		dot := strings.Index(host, ".")
		if !strings.HasSuffix(host, proxyDomain[i:]) || ih <= 0 || dot+1 > ih {
			return nil
		}
		if host[dot+1:ih] == proxyDomain[:i] {
			return []string{host[:dot], host[:ih] + ".svc", host[:ih]}
		}
		return []string{host[:ih], host[:ih] + ".svc"}
	}
	hostParts, domainParts := strings.Split(host, "."), strings.Split(proxyDomain, ".")
	shared := 0
	for shared < min(len(hostParts), len(domainParts)) &&
		hostParts[len(hostParts)-1-shared] == domainParts[len(domainParts)-1-shared] {
		shared++
	}
	if shared == 0 || shared == len(hostParts) {
		return nil
	}
	unique := hostParts[:len(hostParts)-shared]
	out := []string{strings.Join(unique, ".")}
	if len(unique) == 2 {
		out = append(out, out[0]+"."+hostParts[len(hostParts)-shared])
	}
	return out
}

// WithPort lists each name bare and with ":<port>", as istiod writes the domains of a
// proxyless gRPC client's virtual host.
func WithPort(names []string, port uint32) []string {
	p := ":" + strconv.FormatUint(uint64(port), 10)
	out := make([]string, 0, 2*len(names))
	for _, n := range names {
		out = append(out, n, n+p)
	}
	return out
}
