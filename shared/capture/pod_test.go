package capture

import (
	"slices"
	"testing"
)

// TestForPod: the proxy's uid/gid and status port are never captured, the status port
// annotation is honoured beside the proxy's, DNS follows the proxy, TPROXY forces uid 1337.
func TestForPod(t *testing.T) {
	cases := []struct {
		name string
		ann  map[string]string
		p    Proxy
		want func(*Config)
	}{
		{name: "zero proxy is the defaults", want: func(*Config) {}},
		{name: "uid and gid", p: Proxy{UID: 2000, GID: 3000}, want: func(c *Config) { c.ProxyUIDs, c.ProxyGIDs = []uint32{2000}, []uint32{3000} }},
		{name: "status port", p: Proxy{StatusPort: 15030}, want: func(c *Config) { c.ExcludeInboundPorts = []uint16{15090, 15021, 15030} }},
		{
			name: "status port annotation and the proxy's", ann: map[string]string{AnnotationStatusPort: "15040"}, p: Proxy{StatusPort: 15030},
			want: func(c *Config) { c.ExcludeInboundPorts = []uint16{15090, 15021, 15040, 15030} },
		},
		{name: "dns", p: Proxy{DNS: true}, want: func(c *Config) { c.DNS = true }},
		{
			name: "tproxy", ann: map[string]string{AnnotationInterceptionMode: "TPROXY"}, p: Proxy{UID: 2000},
			want: func(c *Config) { c.Mode = TProxy },
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ForPod(tc.ann, tc.p)
			if err != nil {
				t.Fatal(err)
			}
			want := Default()
			tc.want(&want)
			if !slices.Equal(got.Args(), want.Args()) {
				t.Errorf("got  %q\nwant %q", got.Args(), want.Args())
			}
		})
	}
	if _, err := ForPod(map[string]string{AnnotationExcludeOutboundPorts: "x"}, Proxy{}); err == nil {
		t.Error("a bad annotation: no error")
	}
}
