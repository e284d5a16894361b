package configingest

import (
	"errors"
	"net/http"

	"sailplane.dev/services/config-ingest/internal/gatewaystatus"
	"sailplane.dev/shared/config"
	"sailplane.dev/shared/monitoring"
)

// Debug is what config-ingest shows on the monitoring port: its config problems, as JSON at
// /debug/config_problems and on the status page, and the Gateway API status it computed, as
// JSON at /debug/gateway_status (each object's kind, namespace, name and status, as written to
// the API server or, in files mode, as it would be, with a summary: one line per condition and
// whether all is well) and summed up on the status page.
func (s *Service) Debug() monitoring.Debug {
	return monitoring.Debug{
		Endpoints: map[string]http.Handler{
			"/debug/config_problems": http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				monitoring.WriteJSON(w, r, s.configProblems())
			}),
			"/debug/gateway_status": http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				out := []gatewayStatusEntry{}
				for _, c := range s.gatewayStatus() {
					out = append(out, gatewayStatusEntry{GatewayAPIStatus: gatewaystatus.Summary(c), Status: c.Status})
				}
				monitoring.WriteJSON(w, r, out)
			}),
		},
		Status: monitoring.StatusSources{Problems: s.configProblems, GatewayAPI: func() []monitoring.GatewayAPIStatus {
			var out []monitoring.GatewayAPIStatus
			for _, c := range s.gatewayStatus() {
				out = append(out, gatewaystatus.Summary(c))
			}
			return out
		}},
	}
}

// configProblems are Problems with where each is: file, document, resource and field for a
// *config.Error; the whole message for the others (which name their file or source in it).
func (s *Service) configProblems() []monitoring.ConfigProblem {
	out := []monitoring.ConfigProblem{}
	for _, err := range s.Problems() {
		p := monitoring.ConfigProblem{Message: err.Error(), Error: err.Error()}
		if ce, ok := errors.AsType[*config.Error](err); ok {
			p.File, p.Document, p.Kind, p.Namespace, p.Name, p.Field = ce.File, ce.Doc, ce.Kind, ce.Namespace, ce.Name, ce.Field
			if ce.Err != nil {
				p.Message = ce.Err.Error()
			}
		}
		out = append(out, p)
	}
	return out
}

// gatewayStatusEntry is one object of /debug/gateway_status: its summary (as on the status page,
// and as sailplanectl gateway-status shows it) and the whole status.
type gatewayStatusEntry struct {
	monitoring.GatewayAPIStatus
	Status any `json:"status"`
}
