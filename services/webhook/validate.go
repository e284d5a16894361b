package webhook

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	admissionv1 "k8s.io/api/admission/v1"

	"sailplane.dev/shared/config"
	"sailplane.dev/shared/schema"
)

// ReadinessCheckAnnotation marks the resource the webhook of the revision it names always
// refuses: the configuration patcher dry-runs one through the API server to learn that the
// validator is reached before making it fail closed (istiod's check, per revision).
const ReadinessCheckAnnotation = "sailplane.dev/webhook-readiness-check"

// validate admits an Istio resource when config-ingest would serve it: the same parser and
// validator, so the same messages ("VirtualService ns/name: spec.http[0].route[0].weight: …"),
// and Istio's warnings as admission warnings. Only CREATE and UPDATE are judged; a kind
// Sailplane does not read is refused as istiod refuses a type it does not know (the
// configurations send only the kinds it reads).
func (s *Server) validate(req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
	resp, failure := s.judge(req)
	s.metrics.validated(req, failure)
	return resp
}

// judge is validate's decision, and for a refusal (or, as istiod counts it, an operation not
// judged) the reason galley_validation_failed counts it under.
func (s *Server) judge(req *admissionv1.AdmissionRequest) (resp *admissionv1.AdmissionResponse, failure string) {
	if req.Operation != admissionv1.Create && req.Operation != admissionv1.Update {
		return &admissionv1.AdmissionResponse{Allowed: true}, reasonUnsupportedOperation
	}
	raw := req.Object.Raw
	switch {
	case len(raw) == 0:
		return deny("the admission request carries no object"), reasonYAMLDecodeError
	case len(raw) > config.MaxResourceBytes:
		return deny(fmt.Sprintf("%s %s/%s: the object is %d bytes, more than the %d bytes (1.5 MiB) a resource may have",
			req.Kind.Kind, req.Namespace, req.Name, len(raw), config.MaxResourceBytes)), reasonInvalidConfig
	}
	cfgs, errs := config.ParseYAML("", withKnownVersion(raw), req.Namespace)
	if len(errs) > 0 {
		err := errors.Join(errs...)
		failure = reasonInvalidConfig
		switch {
		case errors.Is(err, config.ErrMalformed):
			failure = reasonYAMLDecodeError
		case errors.Is(err, config.ErrUnknownKind):
			failure = reasonUnknownType
		}
		return deny(messages(err)), failure
	}
	if len(cfgs) != 1 {
		return deny("the admission request's object is not one resource"), reasonYAMLDecodeError
	}
	c := cfgs[0]
	c.Source = config.Source{}
	if rev, ok := c.Annotations[ReadinessCheckAnnotation]; ok && rev == s.cfg.Revision {
		return deny(fmt.Sprintf("%s: the readiness check of revision %s is always refused", ReadinessCheckAnnotation, rev)), reasonInvalidConfig
	}
	warnings, err := config.Validate(c)
	resp = &admissionv1.AdmissionResponse{Allowed: err == nil}
	if err != nil {
		resp, failure = deny(messages(err)), reasonInvalidConfig
	}
	for _, w := range warnings {
		resp.Warnings = append(resp.Warnings, w.String())
	}
	if err != nil {
		s.log.Debug("refused invalid config", "kind", c.Kind.Kind, "namespace", c.Namespace, "name", c.Name, "error", err)
	}
	return resp, failure
}

// messages renders config errors one per line, without the document number ParseYAML gives
// (an admission request holds one object).
func messages(err error) string {
	var lines []string
	for _, e := range config.Errors(err) {
		e.File, e.Doc = "", 0
		lines = append(lines, e.Error())
	}
	return strings.Join(lines, "\n")
}

// withKnownVersion rewrites the apiVersion of a kind Sailplane reads to one it knows when the
// object is in another version of the same group: Istio's kinds have one schema in every
// version, so, as istiod does, a version newer than this build is validated, not refused.
func withKnownVersion(raw []byte) []byte {
	var head struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
	}
	if json.Unmarshal(raw, &head) != nil {
		return raw // the parser reports it
	}
	group, _, _ := strings.Cut(head.APIVersion, "/")
	if _, ok := schema.ByAPIVersionKind(head.APIVersion, head.Kind); ok {
		return raw
	}
	for _, k := range schema.IstioConfig {
		if k.Group != group || k.Kind != head.Kind {
			continue
		}
		var obj map[string]json.RawMessage
		if json.Unmarshal(raw, &obj) != nil {
			return raw
		}
		obj["apiVersion"], _ = json.Marshal(k.Group + "/" + k.Version)
		if out, err := json.Marshal(obj); err == nil {
			return out
		}
	}
	return raw
}
