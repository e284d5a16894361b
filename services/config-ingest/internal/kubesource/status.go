package kubesource

import (
	"encoding/json"
	"strings"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/timestamppb"
	analysis "istio.io/api/analysis/v1alpha1"
	istiometa "istio.io/api/meta/v1alpha1"

	"sailplane.dev/shared/config"
)

// The validation message config-ingest writes, in the shape of Istio's analyzers' messages.
// IST0106 is the code istioctl analyze uses for a resource that fails schema validation.
const (
	MessageCode = "IST0106"
	MessageName = "SchemaValidationError"
	messageDoc  = "https://istio.io/latest/docs/reference/config/analysis/ist0106/"
)

// ConditionType is the status condition carrying the validation errors' text: the CRDs prune
// any field of validationMessages but type, level and documentationUrl, so the text that says
// which field is wrong lives in a condition's message.
const ConditionType = "Accepted"

// ConditionReason is the reason of the condition config-ingest writes on an invalid resource.
const ConditionReason = "SchemaValidationError"

// Description renders a validation error as the status shows it: "field: message", several
// joined with "; ".
func Description(err error) string {
	var parts []string
	for _, e := range config.Errors(err) {
		msg := "invalid"
		if e.Err != nil {
			msg = e.Err.Error()
		}
		if e.Field != "" {
			msg = e.Field + ": " + msg
		}
		parts = append(parts, msg)
	}
	return strings.Join(parts, "; ")
}

// statusPatch returns the JSON merge patch that makes cur carry the validation result verr
// (nil: valid), or nil when cur already does. Messages and conditions that are not
// config-ingest's are kept. resourceVersion makes the patch fail on a stale object rather
// than overwrite a newer status.
func statusPatch(cur istioStatus, verr error, resourceVersion string, now time.Time) ([]byte, error) {
	var (
		msgs, conds   []json.RawMessage
		hasMsg        bool
		ourCond       *istiometa.IstioCondition
		desc          = ""
		wantInvalid   = verr != nil
		marshal       = protojson.MarshalOptions{}
		changedFields bool
	)
	if wantInvalid {
		desc = Description(verr)
	}
	for _, m := range cur.GetValidationMessages() {
		if m.GetType().GetCode() == MessageCode {
			hasMsg = true
			continue
		}
		b, err := marshal.Marshal(m)
		if err != nil {
			return nil, err
		}
		msgs = append(msgs, b)
	}
	for _, c := range cur.GetConditions() {
		if c.GetType() == ConditionType {
			ourCond = c
			continue
		}
		b, err := marshal.Marshal(c)
		if err != nil {
			return nil, err
		}
		conds = append(conds, b)
	}
	if wantInvalid {
		changedFields = !hasMsg || ourCond == nil || ourCond.GetStatus() != "False" ||
			ourCond.GetReason() != ConditionReason || ourCond.GetMessage() != desc
	} else {
		changedFields = hasMsg || ourCond != nil
	}
	if !changedFields {
		return nil, nil
	}
	if wantInvalid {
		m, err := marshal.Marshal(&analysis.AnalysisMessageBase{
			Type:             &analysis.AnalysisMessageBase_Type{Code: MessageCode, Name: MessageName},
			Level:            analysis.AnalysisMessageBase_ERROR,
			DocumentationUrl: messageDoc,
		})
		if err != nil {
			return nil, err
		}
		msgs = append(msgs, m)
		c := &istiometa.IstioCondition{Type: ConditionType, Status: "False", Reason: ConditionReason, Message: desc}
		// Keep the transition time when only the message changed: the resource stayed invalid.
		// (Marshal only reads it: sharing the informer's timestamp is safe.)
		c.LastTransitionTime = timestamppb.New(now)
		if ourCond != nil && ourCond.GetStatus() == "False" && ourCond.GetLastTransitionTime() != nil {
			c.LastTransitionTime = ourCond.GetLastTransitionTime()
		}
		b, err := marshal.Marshal(c)
		if err != nil {
			return nil, err
		}
		conds = append(conds, b)
	}
	status := map[string]any{"validationMessages": nilIfEmpty(msgs), "conditions": nilIfEmpty(conds)}
	return json.Marshal(map[string]any{
		"metadata": map[string]any{"resourceVersion": resourceVersion},
		"status":   status,
	})
}

// nilIfEmpty makes an empty list null, which a merge patch reads as "remove the field".
func nilIfEmpty(l []json.RawMessage) any {
	if len(l) == 0 {
		return nil
	}
	return l
}
