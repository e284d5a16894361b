package revision

import (
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func tagWebhook(tag, rev string) *admissionregistrationv1.MutatingWebhookConfiguration {
	return &admissionregistrationv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{
		Name: TagWebhookName(tag), Labels: map[string]string{TagLabel: tag, Label: rev}}}
}

// Which revision owns a label value, with and without tags (istiod's TagWatcher.IsMine).
func TestOwns(t *testing.T) {
	cases := []struct {
		name     string
		tags     map[string]string // tag → revision
		revision string
		value    string
		want     bool
	}{
		{"default owns unlabelled", nil, "default", "", true},
		{"canary does not own unlabelled", nil, "canary", "", false},
		{"own name", nil, "canary", "canary", true},
		{"another revision", nil, "canary", "default", false},
		{"a tag of ours", map[string]string{"prod": "canary"}, "canary", "prod", true},
		{"a tag of another", map[string]string{"prod": "canary"}, "default", "prod", false},
		{"unknown tag", nil, "default", "prod", false},
		{"default tag moves unlabelled to canary", map[string]string{"default": "canary"}, "canary", "", true},
		{"default tag takes unlabelled from default", map[string]string{"default": "canary"}, "default", "", false},
		{"default tag naming default", map[string]string{"default": "default"}, "default", "", true},
		{"default tag moves istio.io/rev=default to canary", map[string]string{"default": "canary"}, "canary", "default", true},
		{"default tag takes istio.io/rev=default from default", map[string]string{"default": "canary"}, "default", "default", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			kc := fake.NewClientset()
			for tag, rev := range c.tags {
				if _, err := kc.AdmissionregistrationV1().MutatingWebhookConfigurations().Create(context.Background(), tagWebhook(tag, rev), metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			// A revision's own webhook (no tag label) is not a tag.
			own := &admissionregistrationv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "own", Labels: map[string]string{Label: "prod"}}}
			if _, err := kc.AdmissionregistrationV1().MutatingWebhookConfigurations().Create(context.Background(), own, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			tags := NewTags(kc, c.revision, nil)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error)
			go func() { done <- tags.Run(ctx) }()
			defer func() { cancel(); <-done }()
			select {
			case <-tags.Synced():
			case <-time.After(10 * time.Second):
				t.Fatal("tags not synced")
			}
			if got := tags.Owns(c.value); got != c.want {
				t.Errorf("revision %q Owns(%q) = %v, want %v (tags %v)", c.revision, c.value, got, c.want, c.tags)
			}
		})
	}
}

func TestStaticAndConfigIn(t *testing.T) {
	if !Static("").Owns("") || !Static("default").Owns("") || Static("canary").Owns("") || !Static("canary").Owns("canary") {
		t.Error("Static: the default revision owns unlabelled objects, a revision its own name")
	}
	if !ConfigIn(Static("canary"), nil) {
		t.Error("unlabelled config is every revision's")
	}
	if ConfigIn(Static("canary"), map[string]string{Label: "default"}) || !ConfigIn(Static("canary"), map[string]string{Label: "canary"}) {
		t.Error("labelled config is its revision's only")
	}
	if Of(map[string]string{Label: "a"}, map[string]string{Label: "b"}) != "a" || Of(nil, map[string]string{Label: "b"}) != "b" {
		t.Error("Of: the object's label, else its namespace's")
	}
}
