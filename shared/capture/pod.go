package capture

import (
	"maps"
	"strconv"
)

// Proxy is what of a pod's injected proxy changes the pod's capture, besides its annotations.
type Proxy struct {
	UID, GID   uint32 // the proxy's user and group, never captured (0: 1337)
	StatusPort uint16 // the agent's status port, never captured inbound (0: 15020)
	DNS        bool   // ISTIO_META_DNS_CAPTURE: DNS to the agent's proxy
}

// ForPod is the capture of a pod with these annotations and this proxy: what injection renders
// as the capture init container's flags, and what the CNI plugin installs for the pod, so both
// modes install the same rules. Errors are those of FromAnnotations, naming the annotations.
func ForPod(annotations map[string]string, p Proxy) (Config, error) {
	base := Default()
	if p.UID != 0 {
		base.ProxyUIDs, base.ProxyGIDs = []uint32{p.UID}, []uint32{p.UID}
	}
	if p.GID != 0 {
		base.ProxyGIDs = []uint32{p.GID}
	}
	if _, ok := annotations[AnnotationStatusPort]; !ok && p.StatusPort != 0 {
		annotations = maps.Clone(annotations)
		if annotations == nil {
			annotations = map[string]string{}
		}
		annotations[AnnotationStatusPort] = strconv.Itoa(int(p.StatusPort))
	}
	c, err := FromAnnotations(annotations, base)
	if err != nil {
		return Config{}, err
	}
	if p.StatusPort != 0 {
		// status.sidecar.istio.io/port names another port: leave the proxy's alone too.
		c.ExcludeInboundPorts = ExcludeInbound(c.ExcludeInboundPorts, p.StatusPort)
	}
	c.DNS = p.DNS
	return c, nil
}
