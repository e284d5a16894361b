// Package spiffe is the workload identity Istio uses: spiffe://<trust-domain>/ns/<ns>/sa/<sa>.
// It holds no crypto, so services that only name identities (xDS policy, the bus) link nothing
// that signs.
package spiffe

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
)

// Scheme is the URI scheme of SPIFFE IDs.
const Scheme = "spiffe"

// ErrInvalid marks a string or URI that is not an Istio SPIFFE ID.
var ErrInvalid = errors.New("not a SPIFFE ID of the form spiffe://<trust-domain>/ns/<namespace>/sa/<service-account>")

// ID is an Istio workload identity.
type ID struct {
	TrustDomain    string
	Namespace      string
	ServiceAccount string
}

// String formats the ID as spiffe://<td>/ns/<ns>/sa/<sa>.
func (id ID) String() string {
	return id.URL().String()
}

// URL is the ID as the URI SAN of a certificate.
func (id ID) URL() *url.URL {
	return &url.URL{Scheme: Scheme, Host: id.TrustDomain, Path: "/ns/" + id.Namespace + "/sa/" + id.ServiceAccount}
}

// SameWorkload reports whether o names the same namespace and service account, whatever its
// trust domain.
func (id ID) SameWorkload(o ID) bool {
	return id.Namespace == o.Namespace && id.ServiceAccount == o.ServiceAccount
}

// Parse reads spiffe://<td>/ns/<ns>/sa/<sa>.
func Parse(s string) (ID, error) {
	u, err := url.Parse(s)
	if err != nil {
		return ID{}, fmt.Errorf("%q: %w", s, ErrInvalid)
	}
	return FromURL(u)
}

// FromURL reads a URI SAN.
func FromURL(u *url.URL) (ID, error) {
	bad := func() (ID, error) { return ID{}, fmt.Errorf("%q: %w", u.String(), ErrInvalid) }
	if u == nil {
		return ID{}, ErrInvalid
	}
	if u.Scheme != Scheme || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" || u.Opaque != "" {
		return bad()
	}
	parts := strings.Split(strings.TrimPrefix(u.Path, "/"), "/")
	if len(parts) != 4 || parts[0] != "ns" || parts[2] != "sa" || parts[1] == "" || parts[3] == "" {
		return bad()
	}
	return ID{TrustDomain: u.Host, Namespace: parts[1], ServiceAccount: parts[3]}, nil
}

// FromServiceAccountUser reads the user name Kubernetes gives a service account token,
// system:serviceaccount:<ns>:<sa>, as an ID in trustDomain.
func FromServiceAccountUser(trustDomain, user string) (ID, error) {
	parts := strings.Split(user, ":")
	if len(parts) != 4 || parts[0] != "system" || parts[1] != "serviceaccount" || parts[2] == "" || parts[3] == "" {
		return ID{}, fmt.Errorf("user %q is not system:serviceaccount:<namespace>:<name>", user)
	}
	return ID{TrustDomain: trustDomain, Namespace: parts[2], ServiceAccount: parts[3]}, nil
}
