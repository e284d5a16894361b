// Package dnsproxy is the agent's DNS server, as Istio's agent (pkg/dns/client): it answers A
// and AAAA queries for the hosts of the control plane's name table (NDS) and forwards every
// other query to the resolv.conf nameservers. The last table received keeps being served while
// the control plane is away.
package dnsproxy

import (
	"net/netip"
	"strings"

	"github.com/miekg/dns"

	ndsv1 "sailplane.dev/proto/istio/networking/nds/v1"
)

// ttl is the answers' TTL, Istio's: short, since the table changes with the mesh.
const ttl = 30

// kubernetesRegistry marks name table entries whose short names the agent derives.
const kubernetesRegistry = "Kubernetes"

// Table is a name table ready to answer from: every name (lower case, fully qualified, with
// the final dot) with its records, the aliases of Kubernetes services included. Immutable.
type Table struct {
	names map[string]*record
	// search are the pod's search domains, fully qualified.
	search []string
}

type record struct {
	a, aaaa []dns.RR // answers copy them under the question's name
}

// Hosts is how many names the table answers (aliases included).
func (t *Table) Hosts() int { return len(t.names) }

// NewTable indexes nt for a workload of namespace ns whose DNS search domains are search
// (resolv.conf's, "<ns>.svc.cluster.local" first in a pod). A Kubernetes service
// <name>.<namespace>.svc.<domain> also answers as <name>.<namespace>, <name>.<namespace>.svc
// and, in the workload's namespace, <name>: what Kubernetes DNS resolves after the resolver
// appended a search domain, for clients that send the short name itself.
func NewTable(nt *ndsv1.NameTable, ns string, search []string) *Table {
	t := &Table{names: make(map[string]*record, len(nt.GetTable())), search: make([]string, 0, len(search))}
	for _, s := range search {
		if s = strings.Trim(strings.ToLower(s), "."); s != "" {
			t.search = append(t.search, s+".")
		}
	}
	for host, info := range nt.GetTable() {
		var v4, v6 []netip.Addr
		for _, ip := range info.GetIps() {
			a, err := netip.ParseAddr(ip)
			switch {
			case err != nil:
			case a.Unmap().Is4():
				v4 = append(v4, a.Unmap())
			default:
				v6 = append(v6, a)
			}
		}
		if len(v4)+len(v6) == 0 {
			continue
		}
		names := aliases(host, info, ns)
		// One record for all the names: answers copy it under the name asked.
		rec := &record{a: records(names[0], v4, dns.TypeA), aaaa: records(names[0], v6, dns.TypeAAAA)}
		for _, name := range names {
			t.names[name] = rec
		}
	}
	return t
}

// aliases are the names host answers as: itself, and for a Kubernetes service in the
// cluster.local-style domain its short forms.
func aliases(host string, info *ndsv1.NameTable_NameInfo, ns string) []string {
	fq := dns.Fqdn(strings.ToLower(host))
	out := []string{fq}
	short, svcNS := strings.ToLower(info.GetShortname()), strings.ToLower(info.GetNamespace())
	if info.GetRegistry() != kubernetesRegistry || short == "" || svcNS == "" {
		return out
	}
	// Only hosts of the form <short>.<namespace>.svc.<domain> have these short forms.
	if !strings.HasPrefix(fq, short+"."+svcNS+".svc.") {
		return out
	}
	out = append(out, short+"."+svcNS+".", short+"."+svcNS+".svc.")
	if svcNS == strings.ToLower(ns) {
		out = append(out, short+".")
	}
	return out
}

func records(name string, ips []netip.Addr, typ uint16) []dns.RR {
	out := make([]dns.RR, 0, len(ips))
	for _, ip := range ips {
		h := dns.RR_Header{Name: name, Rrtype: typ, Class: dns.ClassINET, Ttl: ttl}
		if typ == dns.TypeA {
			out = append(out, &dns.A{Hdr: h, A: ip.AsSlice()})
		} else {
			out = append(out, &dns.AAAA{Hdr: h, AAAA: ip.AsSlice()})
		}
	}
	return out
}

// lookup finds the record of qname (lower case, fully qualified): the name itself, a
// wildcard host covering it ("*.example.com" for "a.b.example.com"), or, when qname is a
// table name with a search domain appended (the resolver's first try for "example.com" is
// "example.com.<ns>.svc.cluster.local"), that name, which the answer gives as a CNAME target so
// the resolver stops searching. target is "" when no CNAME is needed.
func (t *Table) lookup(qname string) (rec *record, target string, ok bool) {
	if rec, ok := t.find(qname); ok {
		return rec, "", true
	}
	for _, s := range t.search {
		if base, found := strings.CutSuffix(qname, "."+s); found && base != "" {
			if rec, ok := t.find(base + "."); ok {
				return rec, base + ".", true
			}
		}
	}
	return nil, "", false
}

// find matches a name exactly, else its closest wildcard.
func (t *Table) find(name string) (*record, bool) {
	if rec, ok := t.names[name]; ok {
		return rec, true
	}
	for i := strings.IndexByte(name, '.'); i >= 0 && i < len(name)-1; i = strings.IndexByte(name[i+1:], '.') + i + 1 {
		if rec, ok := t.names["*"+name[i:]]; ok {
			return rec, true
		}
	}
	return nil, false
}

// answer builds the answers to a question of type qtype for qname found as rec: a CNAME to
// target first when there is one, then the records under the name asked (or the target).
func answer(rec *record, qname, target string, qtype uint16) []dns.RR {
	src := rec.a
	if qtype == dns.TypeAAAA {
		src = rec.aaaa
	}
	owner := qname
	var out []dns.RR
	if target != "" {
		out = append(out, &dns.CNAME{Hdr: dns.RR_Header{Name: qname, Rrtype: dns.TypeCNAME, Class: dns.ClassINET, Ttl: ttl}, Target: target})
		owner = target
	}
	for _, rr := range src {
		c := dns.Copy(rr)
		c.Header().Name = owner
		out = append(out, c)
	}
	return out
}
