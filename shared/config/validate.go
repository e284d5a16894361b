package config

import (
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"strconv"
	"strings"

	"google.golang.org/protobuf/types/known/durationpb"
	networking "istio.io/api/networking/v1alpha3"
	security "istio.io/api/security/v1beta1"
)

// Validate checks c's spec the way Istio's validating webhook does (the rules that matter to a
// control plane: references, ranges, mutually exclusive fields). It returns nil, one *Error, or
// several joined with errors.Join (see Errors); each names its field path from "spec".
func Validate(c Config) error {
	v := &validator{}
	switch s := c.Spec.(type) {
	case *networking.VirtualService:
		v.virtualService(s)
	case *networking.DestinationRule:
		v.destinationRule(s)
	case *networking.ServiceEntry:
		v.serviceEntry(s)
	case *networking.WorkloadEntry:
		v.workloadEntry("spec", s, false)
	case *networking.WorkloadGroup:
		v.workloadGroup(s)
	case *networking.Gateway:
		v.gateway(s)
	case *networking.Sidecar:
		v.sidecar(s)
	case *security.PeerAuthentication:
		v.peerAuthentication(s)
	case *security.AuthorizationPolicy:
		v.authorizationPolicy(s)
	case *security.RequestAuthentication:
		v.requestAuthentication(s)
	case nil:
		v.add("spec", "required")
	default:
		v.add("spec", "unexpected spec type %T for %s", c.Spec, c.Kind.Kind)
	}
	if len(v.errs) == 0 {
		return nil
	}
	errs := make([]error, len(v.errs))
	for i, e := range v.errs {
		e.File, e.Doc = c.Source.File, c.Source.Doc
		e.Kind, e.Namespace, e.Name = c.Kind.Kind, c.Namespace, c.Name
		errs[i] = e
	}
	if len(errs) == 1 {
		return errs[0]
	}
	return errors.Join(errs...)
}

type validator struct {
	errs []*Error
}

func (v *validator) add(path, format string, args ...any) {
	v.errs = append(v.errs, &Error{Field: path, Err: fmt.Errorf(format, args...)})
}

// addMsg adds msg when not empty, for the helpers that return a message.
func (v *validator) addMsg(path, msg string) {
	if msg != "" {
		v.errs = append(v.errs, &Error{Field: path, Err: errors.New(msg)})
	}
}

func idx(path string, i int) string { return path + "[" + strconv.Itoa(i) + "]" }
func key(path, k string) string     { return path + "[" + k + "]" }

var (
	labelRE     = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
	dnsLabelRE  = regexp.MustCompile(`^(?i)[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
	labelValRE  = regexp.MustCompile(`^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$`)
	labelNameRE = regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$`)
	portNameRE  = regexp.MustCompile(`^[a-z0-9]([-a-z0-9_.]*[a-z0-9])?$`)
)

// dns1123Label returns why s is not a Kubernetes DNS-1123 label, or "".
func dns1123Label(s string) string {
	if len(s) > 63 {
		return "must be at most 63 characters"
	}
	if !labelRE.MatchString(s) {
		return fmt.Sprintf("%q is not a valid DNS-1123 label (lowercase letters, digits and '-')", s)
	}
	return ""
}

// dns1123Subdomain returns why s is not a Kubernetes object name (DNS-1123 subdomain), or "".
func dns1123Subdomain(s string) string {
	if len(s) > 253 {
		return "must be at most 253 characters"
	}
	for _, l := range strings.Split(s, ".") {
		if !labelRE.MatchString(l) {
			return fmt.Sprintf("%q is not a valid DNS-1123 subdomain (lowercase letters, digits, '-' and '.')", s)
		}
	}
	return ""
}

// dnsName returns why s is not a DNS name (FQDN or short name), or "".
func dnsName(s string) string {
	if s == "" {
		return "must not be empty"
	}
	if len(s) > 255 {
		return "must be at most 255 characters"
	}
	for _, l := range strings.Split(s, ".") {
		if len(l) > 63 || !dnsLabelRE.MatchString(l) {
			return fmt.Sprintf("%q is not a valid DNS name", s)
		}
	}
	return ""
}

// hostName returns why s is neither a DNS name nor a wildcard ("*" when allowStar, "*.example.com"
// or "*example.com" suffix form), or "".
func hostName(s string, allowStar bool) string {
	if s == "*" {
		if allowStar {
			return ""
		}
		return `"*" is not allowed here`
	}
	if rest, ok := strings.CutPrefix(s, "*"); ok {
		rest = strings.TrimPrefix(rest, ".")
		if dnsName(rest) != "" {
			return fmt.Sprintf("%q is not a valid wildcard host", s)
		}
		return ""
	}
	return dnsName(s)
}

func portNumber(n uint32) string {
	if n < 1 || n > 65535 {
		return fmt.Sprintf("port %d must be between 1 and 65535", n)
	}
	return ""
}

func percent(p float64) string {
	if p < 0 || p > 100 {
		return fmt.Sprintf("must be between 0 and 100, got %v", p)
	}
	return ""
}

func (v *validator) duration(path string, d *durationpb.Duration, allowZero bool) {
	if d == nil {
		return
	}
	if err := d.CheckValid(); err != nil {
		v.add(path, "invalid duration: %v", err)
		return
	}
	dd := d.AsDuration()
	switch {
	case dd < 0:
		v.add(path, "must not be negative")
	case dd == 0 && !allowZero:
		v.add(path, "must be greater than 0")
	}
}

func (v *validator) labels(path string, labels map[string]string) {
	for k, val := range labels {
		name := k
		if prefix, n, ok := strings.Cut(k, "/"); ok {
			if msg := dns1123Subdomain(prefix); msg != "" {
				v.add(key(path, k), "invalid label key prefix: %s", msg)
				continue
			}
			name = n
		}
		if name == "" || len(name) > 63 || !labelNameRE.MatchString(name) {
			v.add(key(path, k), "invalid label key %q", k)
			continue
		}
		if len(val) > 63 || !labelValRE.MatchString(val) {
			v.add(key(path, k), "invalid label value %q", val)
		}
	}
}

// ipOrCIDR returns why s is neither an IP address nor a CIDR block, or "".
func ipOrCIDR(s string) string {
	if strings.Contains(s, "/") {
		if _, err := netip.ParsePrefix(s); err != nil {
			return fmt.Sprintf("%q is not a valid CIDR block", s)
		}
		return ""
	}
	if _, err := netip.ParseAddr(s); err != nil {
		return fmt.Sprintf("%q is not a valid IP address", s)
	}
	return ""
}

func isIP(s string) bool {
	_, err := netip.ParseAddr(s)
	return err == nil
}

// exportTo checks the exportTo entries: ".", "*", "~" or a namespace.
func (v *validator) exportTo(path string, list []string) {
	seen := map[string]bool{}
	for i, e := range list {
		p := idx(path, i)
		switch e {
		case ".", "*", "~":
		default:
			if msg := dns1123Label(e); msg != "" {
				v.add(p, "must be \".\", \"*\", \"~\" or a namespace: %s", msg)
				continue
			}
		}
		if seen[e] {
			v.add(p, "duplicate entry %q", e)
		}
		seen[e] = true
	}
	if seen["*"] && len(list) > 1 {
		v.add(path, `"*" must be the only entry`)
	}
	if seen["~"] && len(list) > 1 {
		v.add(path, `"~" must be the only entry`)
	}
}

var knownProtocols = map[string]bool{
	"HTTP": true, "HTTPS": true, "HTTP2": true, "GRPC": true, "GRPC-WEB": true, "MONGO": true,
	"REDIS": true, "MYSQL": true, "TCP": true, "TLS": true, "UDP": true, "THRIFT": true,
	"UNSUPPORTED": true,
}

func (v *validator) protocol(path, p string, required bool) {
	if p == "" {
		if required {
			v.add(path, "required")
		}
		return
	}
	if !knownProtocols[strings.ToUpper(p)] {
		v.add(path, "unknown protocol %q", p)
	}
}
