package ca

import (
	"testing"

	"k8s.io/client-go/rest"
)

// Without Kubernetes the self-signed root lives in <root>/etc/certs (hyper: the mesh file's
// root); a folder asked for wins, and with Kubernetes there is none (a Secret).
func TestCertDirDefault(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		kube *rest.Config
		root string
		want string
	}{
		{"working folder", Config{}, nil, ".", "etc/certs"},
		{"mesh root", Config{}, nil, "/srv/a", "/srv/a/etc/certs"},
		{"explicit", Config{CertDir: "/certs"}, nil, "/srv/a", "/certs"},
		{"plugged in", Config{PluggedCertDir: "/cacerts"}, nil, "/srv/a", ""},
		{"kubernetes", Config{}, &rest.Config{}, "/srv/a", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.UseKube(tc.kube, tc.root)
			if tc.cfg.CertDir != tc.want {
				t.Errorf("cert dir %q, want %q", tc.cfg.CertDir, tc.want)
			}
		})
	}
}
