package schema

import "testing"

func TestByAPIVersionKind(t *testing.T) {
	tests := []struct {
		apiVersion, kind string
		want             string // type URL; "" for not found
	}{
		{"networking.istio.io/v1", "VirtualService", VirtualService.TypeURL},
		{"networking.istio.io/v1beta1", "VirtualService", VirtualService.TypeURL},
		{"networking.istio.io/v1alpha3", "DestinationRule", DestinationRule.TypeURL},
		{"security.istio.io/v1beta1", "AuthorizationPolicy", AuthorizationPolicy.TypeURL},
		{"networking.istio.io/v2", "VirtualService", ""},
		{"security.istio.io/v1", "VirtualService", ""},
		{"security.istio.io/v1alpha3", "PeerAuthentication", ""},
		{"security.istio.io/v1", "PeerAuthentication", PeerAuthentication.TypeURL},
		{"sailplane.dev/v1", "Service", Service.TypeURL},
		{"v1", "Service", ""},
	}
	for _, tt := range tests {
		t.Run(tt.apiVersion+"/"+tt.kind, func(t *testing.T) {
			k, ok := ByAPIVersionKind(tt.apiVersion, tt.kind)
			if got := k.TypeURL; ok != (tt.want != "") || got != tt.want {
				t.Errorf("ByAPIVersionKind() = %q, %v; want %q", got, ok, tt.want)
			}
		})
	}
}

func TestByTypeURL(t *testing.T) {
	tests := []struct{ url, want string }{
		{"networking.istio.io/v1/VirtualService", VirtualService.TypeURL},
		{"networking.istio.io/v1alpha3/ServiceEntry", ServiceEntry.TypeURL},
		{"security.istio.io/v1beta1/PeerAuthentication", PeerAuthentication.TypeURL},
		{"core/v1alpha1/MeshConfig", MeshConfig.TypeURL},
		{"sailplane.dev/discovery/v1/Endpoints", Endpoints.TypeURL},
		{"sailplane.dev/discovery/v1/Namespace", Namespace.TypeURL},
		{"networking.istio.io/v1alpha3/Nope", ""},
		{"security.istio.io/v1alpha3/PeerAuthentication", ""},
		{"sailplane.dev/v1/Service", ""},
		{"example.com/v1/Unknown", ""},
	}
	for _, tt := range tests {
		k, ok := ByTypeURL(tt.url)
		if ok != (tt.want != "") || k.TypeURL != tt.want {
			t.Errorf("ByTypeURL(%q) = %q, %v; want %q", tt.url, k.TypeURL, ok, tt.want)
		}
	}
}

func TestEveryKindIsComplete(t *testing.T) {
	seen := map[string]bool{}
	for _, k := range All {
		if k.New == nil || k.New() == nil || k.Kind == "" || k.TypeURL == "" {
			t.Errorf("kind %+v is incomplete", k)
		}
		if seen[k.TypeURL] {
			t.Errorf("type URL %s registered twice", k.TypeURL)
		}
		seen[k.TypeURL] = true
	}
}

func TestNames(t *testing.T) {
	if got := Name("demo", "echo"); got != "demo/echo" {
		t.Errorf("Name = %q", got)
	}
	if got := Name("", "mesh"); got != "mesh" {
		t.Errorf("Name = %q", got)
	}
	if ns, n := SplitName("demo/echo"); ns != "demo" || n != "echo" {
		t.Errorf("SplitName = %q, %q", ns, n)
	}
	if ns, n := SplitName("mesh"); ns != "" || n != "mesh" {
		t.Errorf("SplitName = %q, %q", ns, n)
	}
}
