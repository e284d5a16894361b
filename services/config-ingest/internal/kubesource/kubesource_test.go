package kubesource

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"go.uber.org/goleak"
	analysis "istio.io/api/analysis/v1alpha1"
	meshv1alpha1 "istio.io/api/mesh/v1alpha1"
	istiometa "istio.io/api/meta/v1alpha1"
	"k8s.io/apimachinery/pkg/labels"

	"sailplane.dev/shared/config"
)

func TestMain(m *testing.M) {
	// klog starts its flush daemon in init; client-go imports klog.
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("k8s.io/klog/v2.(*flushDaemon).run.func1"))
}

func TestDescription(t *testing.T) {
	err := errors.Join(
		&config.Error{Field: "spec.http[0].route[0].weight", Err: errors.New("must not be negative, got -150")},
		&config.Error{Field: "spec.hosts", Err: errors.New("required")},
	)
	want := "spec.http[0].route[0].weight: must not be negative, got -150; spec.hosts: required"
	if got := Description(err); got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestStatusPatch(t *testing.T) {
	invalid := &config.Error{Field: "spec.hosts", Err: errors.New("required")}
	other := &analysis.AnalysisMessageBase{Type: &analysis.AnalysisMessageBase_Type{Code: "IST0101", Name: "ReferencedResourceNotFound"}, Level: analysis.AnalysisMessageBase_WARNING}
	ours := &analysis.AnalysisMessageBase{Type: &analysis.AnalysisMessageBase_Type{Code: MessageCode, Name: MessageName}, Level: analysis.AnalysisMessageBase_ERROR}
	ourCond := &istiometa.IstioCondition{Type: ConditionType, Status: "False", Reason: ConditionReason, Message: "spec.hosts: required"}
	reconciled := &istiometa.IstioCondition{Type: "Reconciled", Status: "True"}
	for _, c := range []struct {
		name      string
		cur       *istiometa.IstioStatus
		err       error
		wantPatch bool
		wantMsgs  []string // codes
		wantConds []string // types
	}{
		{name: "valid, empty", cur: &istiometa.IstioStatus{}},
		{name: "valid, others' messages kept untouched", cur: &istiometa.IstioStatus{ValidationMessages: []*analysis.AnalysisMessageBase{other}}},
		{name: "invalid, empty", cur: &istiometa.IstioStatus{}, err: invalid, wantPatch: true, wantMsgs: []string{MessageCode}, wantConds: []string{ConditionType}},
		{name: "invalid, already written", cur: &istiometa.IstioStatus{ValidationMessages: []*analysis.AnalysisMessageBase{ours}, Conditions: []*istiometa.IstioCondition{ourCond}}, err: invalid},
		{name: "invalid, other message text", cur: &istiometa.IstioStatus{ValidationMessages: []*analysis.AnalysisMessageBase{ours}, Conditions: []*istiometa.IstioCondition{{Type: ConditionType, Status: "False", Reason: ConditionReason, Message: "old"}}}, err: invalid, wantPatch: true, wantMsgs: []string{MessageCode}, wantConds: []string{ConditionType}},
		{name: "invalid, others kept", cur: &istiometa.IstioStatus{ValidationMessages: []*analysis.AnalysisMessageBase{other}, Conditions: []*istiometa.IstioCondition{reconciled}}, err: invalid, wantPatch: true, wantMsgs: []string{"IST0101", MessageCode}, wantConds: []string{"Reconciled", ConditionType}},
		{name: "valid again, cleared", cur: &istiometa.IstioStatus{ValidationMessages: []*analysis.AnalysisMessageBase{ours}, Conditions: []*istiometa.IstioCondition{ourCond}}, wantPatch: true},
		{name: "valid again, others kept", cur: &istiometa.IstioStatus{ValidationMessages: []*analysis.AnalysisMessageBase{other, ours}, Conditions: []*istiometa.IstioCondition{ourCond, reconciled}}, wantPatch: true, wantMsgs: []string{"IST0101"}, wantConds: []string{"Reconciled"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			patch, err := statusPatch(c.cur, c.err, "42", time.Unix(0, 0))
			if err != nil {
				t.Fatal(err)
			}
			if (patch != nil) != c.wantPatch {
				t.Fatalf("patch %s, want one: %v", patch, c.wantPatch)
			}
			if patch == nil {
				return
			}
			var p struct {
				Metadata struct {
					ResourceVersion string `json:"resourceVersion"`
				} `json:"metadata"`
				Status struct {
					ValidationMessages []struct {
						Type  struct{ Code string }
						Level string
					} `json:"validationMessages"`
					Conditions []struct{ Type, Status, Message string } `json:"conditions"`
				} `json:"status"`
			}
			if err := json.Unmarshal(patch, &p); err != nil {
				t.Fatal(err)
			}
			if p.Metadata.ResourceVersion != "42" {
				t.Errorf("resourceVersion %q", p.Metadata.ResourceVersion)
			}
			var msgs, conds []string
			for _, m := range p.Status.ValidationMessages {
				msgs = append(msgs, m.Type.Code)
				if m.Type.Code == MessageCode && m.Level != "ERROR" {
					t.Errorf("level %q", m.Level)
				}
			}
			for _, cd := range p.Status.Conditions {
				conds = append(conds, cd.Type)
				if cd.Type == ConditionType && cd.Message != "spec.hosts: required" {
					t.Errorf("condition message %q", cd.Message)
				}
			}
			if !equal(msgs, c.wantMsgs) || !equal(conds, c.wantConds) {
				t.Errorf("messages %v conditions %v, want %v %v\n%s", msgs, conds, c.wantMsgs, c.wantConds, patch)
			}
		})
	}
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestSelectors(t *testing.T) {
	m := &meshv1alpha1.MeshConfig{DiscoverySelectors: []*meshv1alpha1.LabelSelector{
		{MatchLabels: map[string]string{"env": "prod", "region": "us-east1"}},
		{MatchExpressions: []*meshv1alpha1.LabelSelectorRequirement{{Key: "app", Operator: "In", Values: []string{"cassandra", "spark"}}}},
	}}
	sels, err := selectors(m)
	if err != nil {
		t.Fatal(err)
	}
	match := func(l map[string]string) bool {
		for _, s := range sels {
			if s.Matches(labels.Set(l)) {
				return true
			}
		}
		return false
	}
	for _, c := range []struct {
		labels map[string]string
		want   bool
	}{
		{map[string]string{"env": "prod", "region": "us-east1"}, true},
		{map[string]string{"env": "prod"}, false},
		{map[string]string{"app": "spark"}, true},
		{map[string]string{"app": "web"}, false},
		{nil, false},
	} {
		if got := match(c.labels); got != c.want {
			t.Errorf("%v: got %v, want %v", c.labels, got, c.want)
		}
	}
	if sels, err := selectors(&meshv1alpha1.MeshConfig{}); err != nil || sels != nil {
		t.Errorf("no selectors: %v %v", sels, err)
	}
	bad := &meshv1alpha1.MeshConfig{DiscoverySelectors: []*meshv1alpha1.LabelSelector{{}, {MatchExpressions: []*meshv1alpha1.LabelSelectorRequirement{{Key: "a", Operator: "Near"}}}}}
	var ce *config.Error
	if _, err := selectors(bad); !errors.As(err, &ce) || ce.Field != "discoverySelectors[1]" {
		t.Errorf("bad operator: %v", err)
	}
}
