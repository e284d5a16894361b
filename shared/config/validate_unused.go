package config

import (
	"maps"
	"strconv"
	"strings"

	"google.golang.org/protobuf/proto"
	networking "istio.io/api/networking/v1alpha3"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// Istio warns about VirtualService rules and matches that can never be used: routes are tried in
// order, so a rule after a match-all rule, or a match identical to (or, for URI prefixes,
// covered by) an earlier one, is dead configuration — usually a mistake in the order.

// routeRule is what the analysis needs of an HTTP, TCP or TLS route.
type routeRule struct {
	path    *field.Path // spec.http[2]
	name    string      // the route's name, quoted, or "#2"
	matches []routeMatch
}

type routeMatch struct {
	path *field.Path // spec.http[2].match[0]
	name string      // the match's name, quoted, or "#0"
	key  string      // identity of what it matches, the name left out
	http *networking.HTTPMatchRequest
}

func (v *validator) unusedRoutes(s *networking.VirtualService) {
	var httpRules []routeRule
	for i, r := range s.Http {
		rr := routeRule{path: specPath.Child("http").Index(i), name: ruleName(r.GetName(), i)}
		for j, m := range r.GetMatch() {
			unnamed := proto.Clone(m).(*networking.HTTPMatchRequest)
			unnamed.Name = ""
			rr.matches = append(rr.matches, routeMatch{path: rr.path.Child("match").Index(j), name: ruleName(m.GetName(), j), key: matchKey(unnamed), http: m})
		}
		httpRules = append(httpRules, rr)
	}
	v.overlappingPrefixes(v.unusedRules(httpRules))

	v.unusedRules(l4Rules[*networking.L4MatchAttributes](specPath.Child("tcp"), s.Tcp))
	v.unusedRules(l4Rules[*networking.TLSMatchAttributes](specPath.Child("tls"), s.Tls))
}

// l4Rules describes TCP or TLS routes, which have no names.
func l4Rules[M proto.Message, R interface{ GetMatch() []M }](p *field.Path, routes []R) []routeRule {
	var rules []routeRule
	for i, r := range routes {
		rr := routeRule{path: p.Index(i), name: ruleName("", i)}
		for j, m := range r.GetMatch() {
			rr.matches = append(rr.matches, routeMatch{path: rr.path.Child("match").Index(j), name: ruleName("", j), key: matchKey(m)})
		}
		rules = append(rules, rr)
	}
	return rules
}

func ruleName(name string, i int) string {
	if name != "" {
		return strconv.Quote(name)
	}
	return "#" + strconv.Itoa(i)
}

func matchKey(m proto.Message) string {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		return err.Error()
	}
	return string(b)
}

// unusedRules warns about rules after a match-all rule and matches already used by an earlier
// rule. It returns the matches that remain in play, in order, for the prefix analysis.
func (v *validator) unusedRules(rules []routeRule) []routeMatch {
	seen := map[string]int{} // match key -> index of the first rule with it
	matchAll := false
	var live []routeMatch
	for i, r := range rules {
		if len(r.matches) == 0 {
			if matchAll {
				v.warn(r.path, "rule %s is never used: only the last rule can have no matches", r.name)
			}
			matchAll = true
			continue
		}
		dups := 0
		for _, m := range r.matches {
			if matchAll {
				v.warn(r.path, "rule %s is never used: an earlier rule has no matches", r.name)
				continue
			}
			if first, ok := seen[m.key]; ok {
				v.warn(m.path, "match %s of rule %s is never used: rule %s has the same match", m.name, r.name, rules[first].name)
				dups++
				continue
			}
			seen[m.key] = i
			m.name += " of rule " + r.name
			live = append(live, m)
		}
		if dups == len(r.matches) {
			v.warn(r.path, "rule %s is never used: all its matches are used by earlier rules", r.name)
		}
	}
	return live
}

// prefixMatch is an HTTP match on a URI prefix, with the other conditions in comparable form.
type prefixMatch struct {
	routeMatch
	prefix, method, authority string
	port                      uint32
	headers, query, without   map[string]string
}

// overlappingPrefixes warns about an HTTP match whose URI prefix, and every other condition, is
// covered by an earlier match: "/api" with GET before "/api/v1" with GET.
func (v *validator) overlappingPrefixes(matches []routeMatch) {
	var pms []prefixMatch
	for _, m := range matches {
		if prefix := m.http.GetUri().GetPrefix(); prefix != "" {
			method := condition(m.http.Method)
			if method == "" {
				method = "exact:GET"
			}
			pms = append(pms, prefixMatch{
				routeMatch: m, prefix: prefix, method: method, authority: condition(m.http.Authority),
				port: m.http.Port, headers: conditions(m.http.Headers), query: conditions(m.http.QueryParams),
				without: conditions(m.http.WithoutHeaders),
			})
		}
	}
	for i, a := range pms {
		for _, b := range pms[i+1:] {
			if a.prefix != b.prefix && covers(a, b) {
				v.warn(b.path, "match %s (prefix %s) is never used: match %s (prefix %s) takes its requests", b.name, b.prefix, a.name, a.prefix)
			}
		}
	}
}

// covers reports whether earlier match a takes every request later match b would: b's prefix
// extends a's and every other condition is the same (or, as Istio compares them, narrower in a).
func covers(a, b prefixMatch) bool {
	narrower := func(x, y string) bool { return x == y || strings.HasPrefix(x, y) }
	sameKeys := func(x, y map[string]string) bool {
		if len(x) != len(y) {
			return false
		}
		for k, xv := range x {
			if yv, ok := y[k]; !ok || !narrower(xv, yv) {
				return false
			}
		}
		return true
	}
	return strings.HasPrefix(b.prefix, a.prefix) && a.port == b.port && narrower(a.method, b.method) &&
		narrower(a.authority, b.authority) && sameKeys(a.headers, b.headers) && sameKeys(a.query, b.query) &&
		sameKeys(a.without, b.without)
}

// condition renders an exact or prefix match as "exact:v" or "prefix:v"; "" for anything else.
func condition(sm *networking.StringMatch) string {
	switch {
	case sm.GetExact() != "":
		return "exact:" + sm.GetExact()
	case sm.GetPrefix() != "":
		return "prefix:" + sm.GetPrefix()
	}
	return ""
}

func conditions(m map[string]*networking.StringMatch) map[string]string {
	out := make(map[string]string, len(m))
	for k, sm := range maps.All(m) {
		out[k] = condition(sm)
	}
	return out
}

// hostsOverlap reports whether two VirtualService hosts can name the same service: equal, or
// one a wildcard covering the other.
func hostsOverlap(a, b string) bool {
	aw, bw := strings.HasPrefix(a, "*"), strings.HasPrefix(b, "*")
	switch {
	case aw && bw:
		if len(a) < len(b) {
			return strings.HasSuffix(b[1:], a[1:])
		}
		return strings.HasSuffix(a[1:], b[1:])
	case aw:
		return strings.HasSuffix(b, a[1:])
	case bw:
		return strings.HasSuffix(a, b[1:])
	}
	return a == b
}
