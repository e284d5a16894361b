package envoygen

import "testing"

// TestParseDefaultEndpoint: Sidecar ingress defaultEndpoint forms, as istiod reads them.
func TestParseDefaultEndpoint(t *testing.T) {
	ips := []string{"fd00::7", "10.0.0.7"}
	for _, tc := range []struct {
		in, want string // want: "ip:port", pipe path, or "" for rejected
		ips      []string
	}{
		{"127.0.0.1:8080", "127.0.0.1:8080", ips},
		{"[::1]:8080", "::1:8080", ips},
		{"0.0.0.0:8080", "10.0.0.7:8080", ips},
		{"[::]:8080", "fd00::7:8080", ips},
		{"0.0.0.0:8080", "127.0.0.1:8080", []string{"fd00::7"}},
		{"[::]:8080", "::1:8080", []string{"10.0.0.7"}},
		{"unix:///var/run/app.sock", "/var/run/app.sock", ips},
		{"unix://", "", ips},
		{"127.0.0.1:0", "", ips},
		{"not-an-endpoint", "", ips},
	} {
		a, ok := parseDefaultEndpoint(tc.in, tc.ips)
		got := a.GetPipe().GetPath()
		if sa := a.GetSocketAddress(); sa != nil {
			got = sa.GetAddress() + ":" + itoa(sa.GetPortValue())
		}
		if ok != (tc.want != "") || got != tc.want {
			t.Errorf("parseDefaultEndpoint(%q, %q) = %q, %v; want %q", tc.in, tc.ips, got, ok, tc.want)
		}
	}
}
