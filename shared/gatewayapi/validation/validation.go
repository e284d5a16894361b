// Package validation checks a Gateway API object read from a file as the Kubernetes API server
// checks it when the Gateway API CRDs are installed, so that what a cluster would refuse is
// refused in files mode too: strict decoding into the sigs.k8s.io/gateway-api Go type, then the
// CRD's OpenAPI schema (unknown fields, types, patterns, enums, bounds, list keys), its defaults,
// and its CEL rules (x-kubernetes-validations), with the API server's own validators
// (k8s.io/apiextensions-apiserver).
//
// The schemas are the standard channel's CRDs of the Gateway API release Sailplane pins,
// embedded (schemas.gen.json, made by `make crds` from deploy/crds/gateway-api). A kind's
// validators are built the first time one of its objects is validated: an Istio-only mesh pays
// nothing. This package is kept apart from shared/config so that only the binaries reading
// config files link the API server's validators.
package validation

import (
	"context"
	_ "embed" // schemas.gen.json
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"
	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel"
	structuraldefaulting "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/defaulting"
	structurallisttype "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/listtype"
	structuralpruning "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/pruning"
	apiservervalidation "k8s.io/apiextensions-apiserver/pkg/apiserver/validation"
	apimachineryvalidation "k8s.io/apimachinery/pkg/api/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	"k8s.io/apimachinery/pkg/util/validation/field"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	sigsjson "sigs.k8s.io/json"

	"sailplane.dev/shared/config"
	"sailplane.dev/shared/gatewayapi/validation/internal/schemafile"
	"sailplane.dev/shared/schema"
)

//go:embed schemas.gen.json
var schemasJSON []byte

// ErrRefused marks what the API server would refuse: the CRD's schema or one of its rules.
var ErrRefused = errors.New("refused by the Gateway API CRD")

// BundleVersion is the Gateway API release whose CRDs validate ("v1.6.3").
func BundleVersion() string {
	f, err := schemas()
	if err != nil {
		return ""
	}
	return f.BundleVersion
}

var schemas = sync.OnceValues(func() (*schemafile.File, error) {
	f, err := schemafile.Decode(schemasJSON)
	if err != nil {
		return nil, fmt.Errorf("gatewayapi/validation: embedded schemas: %w", err)
	}
	return f, nil
})

// kindValidator is what the API server builds from one CRD version.
type kindValidator struct {
	structural *structuralschema.Structural
	schema     apiservervalidation.SchemaValidator
	cel        *cel.Validator // nil when the schema has no rules
}

var (
	validatorsMu sync.Mutex
	validators   = map[string]func() (*kindValidator, error){}
)

// validatorFor returns kind's validator, built on first use (compiling a kind's CEL rules
// takes a while; the other kinds' are not needed).
func validatorFor(kind string) (*kindValidator, error) {
	validatorsMu.Lock()
	build, ok := validators[kind]
	if !ok {
		build = sync.OnceValues(func() (*kindValidator, error) { return newKindValidator(kind) })
		validators[kind] = build
	}
	validatorsMu.Unlock()
	return build()
}

func newKindValidator(kind string) (*kindValidator, error) {
	f, err := schemas()
	if err != nil {
		return nil, err
	}
	ks, ok := f.Kinds[kind]
	if !ok {
		return nil, fmt.Errorf("gatewayapi/validation: no %s CRD in Gateway API %s (%s channel)", kind, f.BundleVersion, f.Channel)
	}
	var v1 apiextensionsv1.JSONSchemaProps
	if err := json.Unmarshal(ks.Schema, &v1); err != nil {
		return nil, fmt.Errorf("gatewayapi/validation: %s schema: %w", kind, err)
	}
	var internal apiextensions.JSONSchemaProps
	if err := apiextensionsv1.Convert_v1_JSONSchemaProps_To_apiextensions_JSONSchemaProps(&v1, &internal, nil); err != nil {
		return nil, fmt.Errorf("gatewayapi/validation: %s schema: %w", kind, err)
	}
	s, err := structuralschema.NewStructural(&internal)
	if err != nil {
		return nil, fmt.Errorf("gatewayapi/validation: %s schema: %w", kind, err)
	}
	// As the API server serves a CRD: defaults pruned of unknown fields.
	s = s.DeepCopy()
	if err := structuraldefaulting.PruneDefaults(s); err != nil {
		return nil, fmt.Errorf("gatewayapi/validation: %s defaults: %w", kind, err)
	}
	sv, _, err := apiservervalidation.NewSchemaValidator(&internal)
	if err != nil {
		return nil, fmt.Errorf("gatewayapi/validation: %s schema: %w", kind, err)
	}
	return &kindValidator{structural: s, schema: sv, cel: cel.NewValidator(s, true, celconfig.PerCallLimit)}, nil
}

// newObject returns an empty Go object of a Gateway API kind, nil for a kind Sailplane does not
// read.
func newObject(k schema.Kind) runtime.Object {
	switch k.TypeURL {
	case schema.GatewayClass.TypeURL:
		return &gwv1.GatewayClass{}
	case schema.KubernetesGateway.TypeURL:
		return &gwv1.Gateway{}
	case schema.ListenerSet.TypeURL:
		return &gwv1.ListenerSet{}
	case schema.HTTPRoute.TypeURL:
		return &gwv1.HTTPRoute{}
	case schema.GRPCRoute.TypeURL:
		return &gwv1.GRPCRoute{}
	case schema.TCPRoute.TypeURL:
		return &gwv1.TCPRoute{}
	case schema.TLSRoute.TypeURL:
		return &gwv1.TLSRoute{}
	case schema.ReferenceGrant.TypeURL:
		return &gwv1.ReferenceGrant{}
	case schema.BackendTLSPolicy.TypeURL:
		return &gwv1.BackendTLSPolicy{}
	}
	return nil
}

// Validate checks c, a Gateway API object parsed by config.ParseYAML, as the API server would
// on creation, and returns it as the API server would store it: with the CRD's defaults set in
// its spec. The error is nil, one *config.Error or several joined (see config.Errors), each
// naming c's file, document and the field at fault; CEL and schema errors wrap ErrRefused,
// unknown fields config.ErrSchema.
func Validate(c config.Config) (config.Config, error) {
	errs := validate(&c)
	if len(errs) == 0 {
		return c, nil
	}
	out := make([]error, len(errs))
	for i, e := range errs {
		e.File, e.Doc = c.Source.File, c.Source.Doc
		e.Kind, e.Group, e.Namespace, e.Name = c.Kind.Kind, c.Kind.Group, c.Namespace, c.Name
		out[i] = e
	}
	if len(out) == 1 {
		return c, out[0]
	}
	return c, errors.Join(out...)
}

func validate(c *config.Config) []*config.Error {
	typed := newObject(c.Kind)
	spec, ok := c.Spec.(*structpb.Struct)
	if typed == nil || !ok {
		return []*config.Error{{Field: "spec", Err: fmt.Errorf("%w: not a Gateway API object (%s, spec %T)", config.ErrSchema, c.Kind.TypeURL, c.Spec)}}
	}
	kv, err := validatorFor(c.Kind.Kind)
	if err != nil {
		return []*config.Error{{Err: err}}
	}
	meta := metav1.ObjectMeta{Name: c.Name, Labels: c.Labels, Annotations: c.Annotations}
	if !c.Kind.ClusterScoped {
		meta.Namespace = c.Namespace
	}
	var errs field.ErrorList
	errs = append(errs, apimachineryvalidation.ValidateObjectMeta(&meta, !c.Kind.ClusterScoped,
		apimachineryvalidation.NameIsDNSSubdomain, field.NewPath("metadata"))...)

	specJSON, err := protojson.Marshal(spec)
	if err != nil {
		return []*config.Error{{Field: "spec", Err: fmt.Errorf("%w: %v", config.ErrMalformed, err)}}
	}
	var specObj map[string]any
	// As the API server decodes: integers as int64, which the schema's "integer" requires.
	if err := utiljson.Unmarshal(specJSON, &specObj); err != nil {
		return []*config.Error{{Field: "spec", Err: fmt.Errorf("%w: %v", config.ErrMalformed, err)}}
	}
	metaObj := map[string]any{"name": c.Name}
	if meta.Namespace != "" {
		metaObj["namespace"] = meta.Namespace
	}
	obj := map[string]any{"apiVersion": c.Kind.APIVersion(), "kind": c.Kind.Kind, "metadata": metaObj, "spec": specObj}

	// Unknown fields, as the API server's strict field validation (kubectl's default) refuses
	// them: those the Go type does not know, and those the standard channel's schema does not
	// (the Go types also carry the experimental channel's fields).
	full, err := json.Marshal(obj)
	if err != nil {
		return []*config.Error{{Field: "spec", Err: fmt.Errorf("%w: %v", config.ErrMalformed, err)}}
	}
	unknown := map[string]bool{}
	var unknownErrs []*config.Error
	addUnknown := func(path string) {
		path = strings.TrimPrefix(path, ".")
		if unknown[path] {
			return
		}
		unknown[path] = true
		name := path
		if i := strings.LastIndexAny(path, ".]"); i >= 0 {
			name = strings.TrimPrefix(path[i+1:], ".")
		}
		unknownErrs = append(unknownErrs, &config.Error{Field: path, Err: fmt.Errorf("%w: unknown field %q", config.ErrSchema, name)})
	}
	strictErrs, decodeErr := sigsjson.UnmarshalStrict(full, typed)
	for _, e := range strictErrs {
		var fe sigsjson.FieldError
		if errors.As(e, &fe) {
			addUnknown(fe.FieldPath())
		}
	}
	for _, p := range structuralpruning.PruneWithOptions(obj, kv.structural, true,
		structuralschema.UnknownFieldPathOptions{TrackUnknownFieldPaths: true}) {
		addUnknown(p)
	}
	if len(unknownErrs) > 0 {
		return unknownErrs
	}

	structuraldefaulting.Default(obj, kv.structural)
	errs = append(errs, apiservervalidation.ValidateCustomResource(nil, obj, kv.schema)...)
	errs = append(errs, structurallisttype.ValidateListSetsAndMaps(nil, kv.structural, obj)...)
	// As the API server: the rules run only on an object whose shape is right.
	if kv.cel != nil && !blocking(errs) {
		celErrs, _ := kv.cel.Validate(context.Background(), nil, kv.structural, obj, nil, celconfig.RuntimeCELCostBudget)
		errs = append(errs, celErrs...)
	}
	if len(errs) == 0 && decodeErr != nil {
		// The schema accepted what the Go type cannot hold: consumers could not decode it.
		return []*config.Error{{Field: "spec", Err: fmt.Errorf("%w: %v", config.ErrSchema, decodeErr)}}
	}
	if len(errs) > 0 {
		out := make([]*config.Error, len(errs))
		for i, e := range errs {
			out[i] = &config.Error{Field: e.Field, Err: fmt.Errorf("%w: %s", ErrRefused, e.ErrorBody())}
		}
		return out
	}
	defaulted, err := structpb.NewStruct(obj["spec"].(map[string]any))
	if err != nil {
		return []*config.Error{{Field: "spec", Err: fmt.Errorf("%w: %v", config.ErrSchema, err)}}
	}
	c.Spec = defaulted
	return nil
}

// blocking reports errors after which the API server does not run the CEL rules (the object's
// shape is wrong, or too big for their cost estimates).
func blocking(errs field.ErrorList) bool {
	for _, e := range errs {
		switch e.Type {
		case field.ErrorTypeNotSupported, field.ErrorTypeRequired, field.ErrorTypeTooLong, field.ErrorTypeTooMany, field.ErrorTypeTypeInvalid:
			return true
		}
	}
	return false
}
