package monitoring

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"slices"
)

// Debug is what a service shows on the monitoring port beside its probes: JSON debug endpoints
// and its sections of the status page.
type Debug struct {
	// Endpoints are JSON debug handlers by path ("/debug/syncz").
	Endpoints map[string]http.Handler
	Status    StatusSources
}

// AddDebug serves the debug endpoints of ds and the status page (at / and /debug/status) with
// every section one of them has, under title. Everything it adds answers loopback callers only
// (HandleDebug). Call it before Run.
func (s *Server) AddDebug(title string, ds ...Debug) {
	page := &statusPage{title: title}
	for _, d := range ds {
		for path, h := range d.Endpoints {
			s.HandleDebug("GET "+path, h)
			page.endpoints = append(page.endpoints, path)
		}
		page.add(d.Status)
	}
	slices.Sort(page.endpoints)
	s.HandleDebug("GET /{$}", page)
	s.HandleDebug("GET /debug/status", page)
	s.HandleDebug("GET /debug/list", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		WriteJSON(w, r, page.endpoints)
	}))
}

// HandleDebug adds a handler answering loopback callers only, as istiod answers unauthenticated
// debug requests only from localhost: the monitoring port is open to probes and Prometheus,
// while what these show (every proxy's configuration, the mesh's config) is for operators, who
// reach it on the host or through `kubectl port-forward` (which connects from the pod's own
// loopback). Call it before Run.
func (s *Server) HandleDebug(pattern string, h http.Handler) {
	s.mux.Handle(pattern, loopbackOnly(h))
}

func loopbackOnly(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !fromLoopback(r) {
			http.Error(w, "debug endpoints answer only loopback callers: use kubectl port-forward, or ask on the host", http.StatusForbidden)
			return
		}
		h.ServeHTTP(w, r)
	})
}

func fromLoopback(r *http.Request) bool {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return false
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}

// WriteJSON writes v as JSON, indented with ?pretty as istiod does.
func WriteJSON(w http.ResponseWriter, r *http.Request, v any) {
	var b []byte
	var err error
	if r.URL.Query().Has("pretty") {
		b, err = json.MarshalIndent(v, "", "  ")
	} else {
		b, err = json.Marshal(v)
	}
	if err != nil {
		http.Error(w, fmt.Sprintf("encoding %s: %v", r.URL.Path, err), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(append(b, '\n'))
}

// mergeSources fills what add has and into lacks.
func mergeSources(into *StatusSources, add StatusSources) {
	if add.Proxies != nil {
		into.Proxies = add.Proxies
	}
	if add.Problems != nil {
		into.Problems = add.Problems
	}
	if add.Pushes != nil {
		into.Pushes = add.Pushes
	}
	if add.GatewayAPI != nil {
		into.GatewayAPI = add.GatewayAPI
	}
}
