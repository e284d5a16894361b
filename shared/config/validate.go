package config

import (
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"strconv"
	"strings"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	networking "istio.io/api/networking/v1alpha3"
	security "istio.io/api/security/v1beta1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"sailplane.dev/shared/schema"
)

// Validate checks c the way Istio's validating webhook does (the rules that matter to a control
// plane: references, ranges, mutually exclusive fields). It returns the warnings Istio would give
// (the resource is still valid) and nil, one *Error, or several joined with errors.Join (see
// Errors); each names its field path from "metadata" or "spec".
func Validate(c Config) ([]*Warning, error) {
	v := &validator{}
	v.metadata(c)
	switch s := c.Spec.(type) {
	case *networking.VirtualService:
		v.virtualService(s)
	case *networking.DestinationRule:
		v.destinationRule(s)
	case *networking.ServiceEntry:
		v.serviceEntry(s, c.Labels)
	case *networking.WorkloadEntry:
		v.workloadEntry(specPath, s, false)
	case *networking.WorkloadGroup:
		v.workloadGroup(s)
	case *networking.Gateway:
		v.gateway(c.Name, s)
	case *networking.Sidecar:
		v.sidecar(s)
	case *security.PeerAuthentication:
		v.peerAuthentication(s)
	case *security.AuthorizationPolicy:
		v.authorizationPolicy(s)
	case *security.RequestAuthentication:
		v.requestAuthentication(s)
	case *structpb.Struct:
		// A Gateway API spec: its CRD's schema and rules are applied by
		// sailplane.dev/shared/gatewayapi/validation, which this package does not link (it
		// brings the API server's validators to every binary that reads config).
		if c.Kind.Group != schema.GatewayAPIGroup {
			v.add(specPath, "unexpected spec type %T for %s", c.Spec, c.Kind.Kind)
		}
	case nil:
		v.add(specPath, "required")
	default:
		v.add(specPath, "unexpected spec type %T for %s", c.Spec, c.Kind.Kind)
	}
	for _, w := range v.warns {
		w.File, w.Doc = c.Source.File, c.Source.Doc
		w.Kind, w.Namespace, w.Name = c.Kind.Kind, c.Namespace, c.Name
	}
	if len(v.errs) == 0 {
		return v.warns, nil
	}
	errs := make([]error, len(v.errs))
	for i, e := range v.errs {
		e.File, e.Doc = c.Source.File, c.Source.Doc
		e.Kind, e.Group, e.Namespace, e.Name = c.Kind.Kind, c.Kind.Group, c.Namespace, c.Name
		errs[i] = e
	}
	if len(errs) == 1 {
		return v.warns, errs[0]
	}
	return v.warns, errors.Join(errs...)
}

// The roots of every field path.
var (
	specPath     = field.NewPath("spec")
	metadataPath = field.NewPath("metadata")
)

type validator struct {
	errs  []*Error
	warns []*Warning
}

func (v *validator) add(path *field.Path, format string, args ...any) {
	v.errs = append(v.errs, &Error{Field: path.String(), Err: fmt.Errorf(format, args...)})
}

// addMsg adds msg when not empty, for the helpers that return a message.
func (v *validator) addMsg(path *field.Path, msg string) {
	if msg != "" {
		v.errs = append(v.errs, &Error{Field: path.String(), Err: errors.New(msg)})
	}
}

func (v *validator) warn(path *field.Path, format string, args ...any) {
	v.warns = append(v.warns, &Warning{Field: path.String(), Message: fmt.Sprintf(format, args...)})
}

// Annotations Istio reserves for itself; a user's resource carrying one is refused.
const (
	dryRunAnnotation = "istio.io/dry-run"
	alwaysReject     = "internal.istio.io/webhook-always-reject"
)

var internalAnnotations = []string{"internal.istio.io/parent-namespace", "internal.istio.io/parents"}

// metadata checks the name, namespace and annotations. Names the Kubernetes API server would
// refuse are only warnings: they cannot come from a cluster, and Istio accepts them from files.
func (v *validator) metadata(c Config) {
	if len(validation.IsDNS1123Subdomain(c.Name)) > 0 {
		v.warn(metadataPath.Child("name"), "%q is not a name the Kubernetes API server accepts (a DNS-1123 subdomain: lowercase letters, digits, '-' and '.')", c.Name)
	}
	if c.Namespace != "" && len(validation.IsDNS1123Label(c.Namespace)) > 0 {
		v.warn(metadataPath.Child("namespace"), "%q is not a namespace the Kubernetes API server accepts (a DNS-1123 label: lowercase letters, digits and '-')", c.Namespace)
	}
	if val, ok := c.Annotations[dryRunAnnotation]; ok {
		p := metadataPath.Child("annotations").Key(dryRunAnnotation)
		ap, isAuthz := c.Spec.(*security.AuthorizationPolicy)
		switch {
		case !isAuthz:
			v.add(p, "only AuthorizationPolicy supports this annotation")
		case ap.Action != security.AuthorizationPolicy_ALLOW && ap.Action != security.AuthorizationPolicy_DENY:
			v.add(p, "only supported with action ALLOW or DENY, not %s", ap.Action)
		default:
			if _, err := strconv.ParseBool(val); err != nil {
				v.add(p, "%q is not true or false", val)
			}
		}
	}
	if _, ok := c.Annotations[alwaysReject]; ok {
		v.add(metadataPath.Child("annotations").Key(alwaysReject), "resources with this annotation are always rejected")
	}
	for _, a := range internalAnnotations {
		if _, ok := c.Annotations[a]; ok {
			v.add(metadataPath.Child("annotations").Key(a), "reserved for resources Istio generates; users may not set it")
		}
	}
}

var dnsLabelRE = regexp.MustCompile(`^(?i)[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

// dnsLabel returns why s is not a DNS label as Istio checks them in specs (port, subset and
// gateway names, namespaces): RFC 1123, at most 63 characters, in either case; or "".
func dnsLabel(s string) string {
	if len(s) > 63 || !dnsLabelRE.MatchString(s) {
		return fmt.Sprintf("%q is not a valid DNS label (letters, digits and '-', at most 63)", s)
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

func (v *validator) duration(path *field.Path, d *durationpb.Duration, allowZero bool) {
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

func (v *validator) labels(path *field.Path, labels map[string]string) {
	for k, val := range labels {
		if msgs := validation.IsQualifiedName(k); len(msgs) > 0 {
			v.add(path.Key(k), "invalid label key %q: %s", k, strings.Join(msgs, "; "))
			continue
		}
		if msgs := validation.IsValidLabelValue(val); len(msgs) > 0 {
			v.add(path.Key(k), "invalid label value %q: %s", val, strings.Join(msgs, "; "))
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
func (v *validator) exportTo(path *field.Path, list []string) {
	seen := map[string]bool{}
	for i, e := range list {
		p := path.Index(i)
		switch e {
		case ".", "*", "~":
		default:
			if msg := dnsLabel(e); msg != "" {
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

var (
	httpProtocols = map[string]bool{"HTTP": true, "HTTP2": true, "GRPC": true, "GRPC-WEB": true, "HTTP_PROXY": true}
	// tcpProtocols are carried over TCP without Envoy's HTTP processing.
	tcpProtocols = map[string]bool{"TCP": true, "HTTPS": true, "TLS": true, "MONGO": true, "REDIS": true, "MYSQL": true}
)

func (v *validator) protocol(path *field.Path, p string, required bool) {
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
