package capture

import (
	"errors"
	"fmt"
	"sort"
)

// The pod annotations that change capture (Istio's names).
const (
	AnnotationInterceptionMode        = "sidecar.istio.io/interceptionMode"
	AnnotationStatusPort              = "status.sidecar.istio.io/port"
	AnnotationIncludeOutboundIPRanges = "traffic.sidecar.istio.io/includeOutboundIPRanges"
	AnnotationExcludeOutboundIPRanges = "traffic.sidecar.istio.io/excludeOutboundIPRanges"
	AnnotationIncludeInboundPorts     = "traffic.sidecar.istio.io/includeInboundPorts"
	AnnotationExcludeInboundPorts     = "traffic.sidecar.istio.io/excludeInboundPorts"
	AnnotationIncludeOutboundPorts    = "traffic.sidecar.istio.io/includeOutboundPorts"
	AnnotationExcludeOutboundPorts    = "traffic.sidecar.istio.io/excludeOutboundPorts"
	AnnotationExcludeInterfaces       = "traffic.sidecar.istio.io/excludeInterfaces"
	AnnotationKubevirtInterfaces      = "traffic.sidecar.istio.io/kubevirtInterfaces"
	// AnnotationRerouteVirtualInterfaces is the newer name of kubevirtInterfaces; it wins.
	AnnotationRerouteVirtualInterfaces = "istio.io/reroute-virtual-interfaces"
)

// AnnotationError is a capture annotation whose value does not parse.
type AnnotationError struct {
	Annotation, Value string
	Err               error
}

func (e *AnnotationError) Error() string {
	return fmt.Sprintf("annotation %s: invalid value %q: %v", e.Annotation, e.Value, e.Err)
}

func (e *AnnotationError) Unwrap() error { return e.Err }

// FromAnnotations is the capture of a pod with these annotations, starting from base (Default(),
// or the mesh's values). Every bad annotation is reported (errors.Join of *AnnotationError, in
// annotation order), so the pod is refused with all of them named, never half-captured.
func FromAnnotations(annotations map[string]string, base Config) (Config, error) {
	c := base
	var errs []error
	bad := func(name string, err error) {
		errs = append(errs, &AnnotationError{Annotation: name, Value: annotations[name], Err: err})
	}
	statusPort := uint16(StatusPort)
	// Sorted so errors come in a stable order.
	names := make([]string, 0, len(annotations))
	for k := range annotations {
		names = append(names, k)
	}
	sort.Strings(names)
	var userExclude []uint16
	for _, name := range names {
		v := annotations[name]
		switch name {
		case AnnotationInterceptionMode:
			m, err := ParseMode(v)
			if err != nil {
				bad(name, err)
				continue
			}
			c.Mode = m
			if m == TProxy {
				// TPROXY needs the proxy at uid 1337: Istio's template forces it.
				c.ProxyUIDs, c.ProxyGIDs = []uint32{ProxyUID}, []uint32{ProxyUID}
			}
		case AnnotationStatusPort:
			p, err := parsePort(v)
			if err != nil {
				bad(name, err)
				continue
			}
			statusPort = p
		case AnnotationIncludeOutboundIPRanges:
			r, err := ParseRanges(v, true)
			if err != nil {
				bad(name, err)
				continue
			}
			c.OutboundIPRanges = r
		case AnnotationExcludeOutboundIPRanges:
			r, err := ParseRanges(v, false)
			if err != nil {
				bad(name, err)
				continue
			}
			c.ExcludeOutboundIPRanges = r.List
		case AnnotationIncludeInboundPorts:
			p, err := ParsePorts(v, true)
			if err != nil {
				bad(name, err)
				continue
			}
			c.InboundPorts = p
		case AnnotationExcludeInboundPorts:
			p, err := ParsePorts(v, false)
			if err != nil {
				bad(name, err)
				continue
			}
			userExclude = p.List
		case AnnotationIncludeOutboundPorts:
			p, err := ParsePorts(v, false)
			if err != nil {
				bad(name, err)
				continue
			}
			c.OutboundPorts = p.List
		case AnnotationExcludeOutboundPorts:
			p, err := ParsePorts(v, false)
			if err != nil {
				bad(name, err)
				continue
			}
			c.ExcludeOutboundPorts = p.List
		case AnnotationExcludeInterfaces:
			l, err := ParseInterfaces(v)
			if err != nil {
				bad(name, err)
				continue
			}
			c.ExcludeInterfaces = l
		case AnnotationKubevirtInterfaces, AnnotationRerouteVirtualInterfaces:
			if _, newer := annotations[AnnotationRerouteVirtualInterfaces]; newer && name == AnnotationKubevirtInterfaces {
				continue
			}
			l, err := ParseInterfaces(v)
			if err != nil {
				bad(name, err)
				continue
			}
			c.KubeVirtInterfaces = l
		}
	}
	if err := errors.Join(errs...); err != nil {
		return Config{}, err
	}
	if userExclude != nil || statusPort != StatusPort {
		// The template's -d: 15090,15021, the user's ports, the status port.
		c.ExcludeInboundPorts = ExcludeInbound(append([]uint16{PrometheusPort, HealthPort}, userExclude...), statusPort)
	}
	return c, nil
}
