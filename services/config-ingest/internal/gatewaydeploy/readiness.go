package gatewaydeploy

import (
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
)

// Readiness is what a Gateway's Programmed condition needs to know of its deployment.
type Readiness struct {
	// Programmed: the Service has an address and the Deployment has a ready replica.
	Programmed bool
	// Reason and Message explain Programmed=False (Reason is AddressNotAssigned, as istiod's),
	// or say where the Gateway is served when it is programmed.
	Reason  gwv1.GatewayConditionReason
	Message string
	// Addresses are the Gateway's status.addresses: the load balancer's ingress IPs or host
	// names for a LoadBalancer Service, else its cluster IPs.
	Addresses []gwv1.GatewayStatusAddress
}

// Assess says whether a deployed Gateway is programmed, from its generated Service and
// Deployment (nil when not created yet). domain is the cluster domain ("cluster.local").
func Assess(gw *gwv1.Gateway, svc *corev1.Service, dep *appsv1.Deployment, domain string) Readiness {
	name, _ := Names(gw)
	host := fmt.Sprintf("%s.%s.svc.%s", name, gw.Namespace, domain)
	if svc == nil || dep == nil {
		return Readiness{Reason: gwv1.GatewayReasonAddressNotAssigned, Message: fmt.Sprintf("Failed to assign to any requested addresses: the gateway's Service and Deployment %s/%s are not created yet", gw.Namespace, name)}
	}
	var addrs []gwv1.GatewayStatusAddress
	ipType, hostType := gwv1.IPAddressType, gwv1.HostnameAddressType
	if svc.Spec.Type == corev1.ServiceTypeLoadBalancer {
		for _, in := range svc.Status.LoadBalancer.Ingress {
			switch {
			case in.IP != "":
				addrs = append(addrs, gwv1.GatewayStatusAddress{Type: &ipType, Value: in.IP})
			case in.Hostname != "":
				addrs = append(addrs, gwv1.GatewayStatusAddress{Type: &hostType, Value: in.Hostname})
			}
		}
	} else {
		for _, ip := range svc.Spec.ClusterIPs {
			if ip != "" && ip != corev1.ClusterIPNone {
				addrs = append(addrs, gwv1.GatewayStatusAddress{Type: &ipType, Value: ip})
			}
		}
	}
	r := Readiness{Addresses: addrs}
	switch {
	case dep.Status.ReadyReplicas == 0:
		r.Reason, r.Message = gwv1.GatewayReasonAddressNotAssigned, fmt.Sprintf("Failed to assign to any requested addresses: no instances found for hostname %q (Deployment %s/%s has no ready replica)", host, dep.Namespace, dep.Name)
	case len(addrs) == 0 && svc.Spec.Type == corev1.ServiceTypeLoadBalancer:
		// A cluster without a load balancer controller never gets there: say so, and how out.
		r.Reason, r.Message = gwv1.GatewayReasonAddressNotAssigned, fmt.Sprintf("Assigned to service(s) %s, but failed to assign to all requested addresses: address pending for hostname %q (the LoadBalancer Service has no ingress address; without a load balancer in the cluster, annotate the Gateway %s: ClusterIP)", host, host, ServiceTypeAnnotation)
	case len(addrs) == 0:
		r.Reason, r.Message = gwv1.GatewayReasonAddressNotAssigned, fmt.Sprintf("Failed to assign to any requested addresses: Service %s/%s has no address", svc.Namespace, svc.Name)
	default:
		r.Programmed, r.Reason, r.Message = true, gwv1.GatewayReasonProgrammed, fmt.Sprintf("Resource programmed, assigned to service(s) %s", host)
	}
	return r
}

// Readiness assesses a Gateway from the controller's caches of the objects it generated.
func (c *Controller) Readiness(gw *gwv1.Gateway, domain string) Readiness {
	name, _ := Names(gw)
	var svc *corev1.Service
	var dep *appsv1.Deployment
	if o, ok, _ := c.owned[kinds[2].gvr].GetIndexer().GetByKey(gw.Namespace + "/" + name); ok {
		svc = &corev1.Service{}
		if runtime.DefaultUnstructuredConverter.FromUnstructured(o.(interface{ UnstructuredContent() map[string]any }).UnstructuredContent(), svc) != nil {
			svc = nil
		}
	}
	if o, ok, _ := c.owned[kinds[1].gvr].GetIndexer().GetByKey(gw.Namespace + "/" + name); ok {
		dep = &appsv1.Deployment{}
		if runtime.DefaultUnstructuredConverter.FromUnstructured(o.(interface{ UnstructuredContent() map[string]any }).UnstructuredContent(), dep) != nil {
			dep = nil
		}
	}
	return Assess(gw, svc, dep, domain)
}

// ServiceReady reports, for a Service this controller generated (namespace/name), whether its
// Deployment has a ready replica; known is false for any other Service.
func (c *Controller) ServiceReady(namespace, name string) (ready, known bool) {
	o, ok, _ := c.owned[kinds[1].gvr].GetIndexer().GetByKey(namespace + "/" + name)
	if !ok {
		return false, false
	}
	dep := &appsv1.Deployment{}
	u, isU := o.(interface{ UnstructuredContent() map[string]any })
	if !isU || runtime.DefaultUnstructuredConverter.FromUnstructured(u.UnstructuredContent(), dep) != nil {
		return false, false
	}
	return dep.Status.ReadyReplicas > 0, true
}
