// Package analyze finds the problems a set of Istio and Gateway API config resources has
// together, which validating each resource on its own cannot see: a VirtualService naming a
// subset no DestinationRule defines, a gateway no Gateway resource is, a host no service has, two
// DestinationRules or VirtualServices for one host; a route whose parent or backend does not
// exist or does not accept it, a reference without its ReferenceGrant. Messages use Istio's codes and texts
// (istioctl analyze) where Istio has the check. It also reads config files the way config-ingest
// does (Set.AddFile), so that `sailplanectl validate` and `analyze` report the same problems
// config-ingest would.
package analyze

import (
	"fmt"
	"strconv"
	"strings"

	"sailplane.dev/shared/config"
)

// Level is how bad a message is; Error fails `sailplanectl analyze` and `validate`.
type Level string

const (
	Error   Level = "Error"
	Warning Level = "Warning"
	// Info is worth knowing but not a problem; it never fails a command.
	Info Level = "Info"
)

// Codes of the messages, Istio's (pkg/config/analysis/msg/messages.yaml) where Istio has the check,
// else Sailplane's own (SPL…).
const (
	// CodeReferencedResourceNotFound is Istio's ReferencedResourceNotFound.
	CodeReferencedResourceNotFound = "IST0101"
	// CodeSchemaValidationError is Istio's SchemaValidationError: the resource is invalid.
	CodeSchemaValidationError = "IST0106"
	// CodeConflictingMeshGatewayVirtualServiceHosts is Istio's ConflictingMeshGatewayVirtualServiceHosts.
	CodeConflictingMeshGatewayVirtualServiceHosts = "IST0109"
	// CodeVirtualServiceHostNotFoundInGateway is Istio's VirtualServiceHostNotFoundInGateway.
	CodeVirtualServiceHostNotFoundInGateway = "IST0132"
	// CodeUnknownDestinationRuleHost is Istio's UnknownDestinationRuleHost.
	CodeUnknownDestinationRuleHost = "IST0174"
	// CodeNegativeConditionStatus is Istio's NegativeConditionStatus: an object's status (here the
	// one Translate computes) has a negative condition, e.g. a route its parent does not accept.
	CodeNegativeConditionStatus = "IST0171"
	// CodeSchemaWarning is Istio's SchemaWarning: valid, but Istio warns about it.
	CodeSchemaWarning = "IST0158"
	// CodeConflictingDestinationRules: two DestinationRules of one namespace for one host, without
	// workload selectors. Istio merges them; Sailplane applies one (the oldest), so the other's
	// settings are lost.
	CodeConflictingDestinationRules = "SPL0001"
	// CodeUnusedReferenceGrant: a ReferenceGrant no cross-namespace reference uses.
	CodeUnusedReferenceGrant = "SPL0002"
	// CodeGatewayClassNotServed: a Gateway of a class Sailplane does not serve.
	CodeGatewayClassNotServed = "SPL0003"
)

// Message is one problem, with the resource and field it is about and where that resource was
// read.
type Message struct {
	Level     Level  `json:"level"`
	Code      string `json:"code,omitempty"`
	Kind      string `json:"kind,omitempty"`
	Namespace string `json:"namespace,omitempty"`
	Name      string `json:"name,omitempty"`
	File      string `json:"file,omitempty"`
	// Doc is the 1-based document index in File, as in config.Source.
	Doc int `json:"document,omitempty"`
	// Field is the path of the field at fault, e.g. "spec.http[0].route[1].destination.subset".
	Field   string `json:"field,omitempty"`
	Message string `json:"message"`
}

// Resource is "Kind namespace/name" (or less, when not known).
func (m Message) Resource() string {
	name := m.Name
	if m.Namespace != "" {
		name = m.Namespace + "/" + name
	}
	return strings.TrimSpace(m.Kind + " " + name)
}

// Origin is "file document N", or less when not known (a resource read from a bus has none).
func (m Message) Origin() string {
	switch {
	case m.File == "":
		return ""
	case m.Doc == 0:
		return m.File
	default:
		return m.File + " document " + strconv.Itoa(m.Doc)
	}
}

// String renders the message as istioctl analyze does, with the document in place of the line:
// `Error [IST0101] (VirtualService demo/web a.yaml document 2) spec.http[0]…: Referenced …`.
func (m Message) String() string {
	var b strings.Builder
	b.WriteString(string(m.Level))
	if m.Code != "" {
		fmt.Fprintf(&b, " [%s]", m.Code)
	}
	if where := strings.TrimSpace(m.Resource() + " " + m.Origin()); where != "" {
		fmt.Fprintf(&b, " (%s)", where)
	}
	b.WriteString(" ")
	if m.Field != "" {
		b.WriteString(m.Field)
		b.WriteString(": ")
	}
	b.WriteString(m.Message)
	return b.String()
}

// about fills the message's resource and origin from c.
func about(c config.Config, level Level, code, field, text string) Message {
	return Message{
		Level: level, Code: code, Kind: c.Kind.Kind, Namespace: c.Namespace, Name: c.Name,
		File: c.Source.File, Doc: c.Source.Doc, Field: field, Message: text,
	}
}

// HasErrors reports whether any message is an Error.
func HasErrors(msgs []Message) bool {
	for _, m := range msgs {
		if m.Level == Error {
			return true
		}
	}
	return false
}
