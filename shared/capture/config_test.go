package capture

import (
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/pflag"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestFromAnnotations(t *testing.T) {
	cases := []struct {
		name string
		ann  map[string]string
		want func(*Config)
	}{
		{name: "none", ann: nil, want: func(*Config) {}},
		{
			name: "all",
			ann: map[string]string{
				AnnotationInterceptionMode:        "TPROXY",
				AnnotationIncludeOutboundIPRanges: "10.0.0.0/8, fd00::/8",
				AnnotationExcludeOutboundIPRanges: "10.96.0.1/32",
				AnnotationIncludeInboundPorts:     "8080,9090",
				AnnotationExcludeInboundPorts:     "8081",
				AnnotationIncludeOutboundPorts:    "3306",
				AnnotationExcludeOutboundPorts:    "25",
				AnnotationExcludeInterfaces:       "eth1",
				AnnotationKubevirtInterfaces:      "net1",
				AnnotationStatusPort:              "15099",
			},
			want: func(c *Config) {
				c.Mode = TProxy
				c.OutboundIPRanges = Ranges{List: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/8")}}
				c.ExcludeOutboundIPRanges = []netip.Prefix{netip.MustParsePrefix("10.96.0.1/32")}
				c.InboundPorts = Ports{List: []uint16{8080, 9090}}
				c.ExcludeInboundPorts = []uint16{15090, 15021, 8081, 15099}
				c.OutboundPorts = []uint16{3306}
				c.ExcludeOutboundPorts = []uint16{25}
				c.ExcludeInterfaces = []string{"eth1"}
				c.KubeVirtInterfaces = []string{"net1"}
			},
		},
		{
			name: "reroute-virtual-interfaces wins",
			ann:  map[string]string{AnnotationKubevirtInterfaces: "net1", AnnotationRerouteVirtualInterfaces: "net2"},
			want: func(c *Config) { c.KubeVirtInterfaces = []string{"net2"} },
		},
		{
			name: "empty lists capture nothing",
			ann:  map[string]string{AnnotationIncludeOutboundIPRanges: "", AnnotationIncludeInboundPorts: ""},
			want: func(c *Config) { c.OutboundIPRanges = Ranges{}; c.InboundPorts = Ports{} },
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := FromAnnotations(tc.ann, Default())
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
}

// TestBadAnnotations: each bad value is refused, the error naming the annotation and value.
func TestBadAnnotations(t *testing.T) {
	for name, value := range map[string]string{
		AnnotationInterceptionMode:         "MAGIC",
		AnnotationIncludeOutboundIPRanges:  "10.0.0.0/8,10.1.2.3",
		AnnotationExcludeOutboundIPRanges:  "*",
		AnnotationIncludeInboundPorts:      "80,http",
		AnnotationExcludeInboundPorts:      "70000",
		AnnotationIncludeOutboundPorts:     "0",
		AnnotationExcludeOutboundPorts:     "-1",
		AnnotationExcludeInterfaces:        "eth0 -j ACCEPT",
		AnnotationKubevirtInterfaces:       "net1\n-A OUTPUT",
		AnnotationRerouteVirtualInterfaces: "averyveryverylongname",
		AnnotationStatusPort:               "x",
	} {
		t.Run(name, func(t *testing.T) {
			_, err := FromAnnotations(map[string]string{name: value}, Default())
			var ae *AnnotationError
			if !errors.As(err, &ae) || ae.Annotation != name || !strings.Contains(err.Error(), name) {
				t.Fatalf("got %v, want an error naming %s", err, name)
			}
		})
	}
	// All bad annotations are reported at once.
	_, err := FromAnnotations(map[string]string{AnnotationIncludeInboundPorts: "x", AnnotationExcludeOutboundPorts: "y"}, Default())
	if err == nil || !strings.Contains(err.Error(), AnnotationIncludeInboundPorts) || !strings.Contains(err.Error(), AnnotationExcludeOutboundPorts) {
		t.Errorf("got %v, want both annotations named", err)
	}
}

// TestArgsRoundTrip: the flags the webhook renders parse back to the same capture.
func TestArgsRoundTrip(t *testing.T) {
	c, err := FromAnnotations(map[string]string{
		AnnotationIncludeOutboundIPRanges: "10.0.0.0/8",
		AnnotationExcludeInboundPorts:     "8081",
		AnnotationExcludeInterfaces:       "eth1",
		AnnotationInterceptionMode:        "TPROXY",
	}, Default())
	if err != nil {
		t.Fatal(err)
	}
	c.DNS = true
	var f Flags
	fs := pflag.NewFlagSet("capture", pflag.ContinueOnError)
	f.AddFlags(fs)
	if err := fs.Parse(c.Args()); err != nil {
		t.Fatal(err)
	}
	got, err := f.Config()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got.Args(), c.Args()) {
		t.Errorf("got  %q\nwant %q", got.Args(), c.Args())
	}
}

func TestFlags(t *testing.T) {
	parse := func(args ...string) (Config, error) {
		var f Flags
		fs := pflag.NewFlagSet("capture", pflag.ContinueOnError)
		f.AddFlags(fs)
		if err := fs.Parse(args); err != nil {
			return Config{}, err
		}
		return f.Config()
	}
	c, err := parse()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(c.Args(), Default().Args()) {
		t.Errorf("no flags: got %q, want the injection defaults %q", c.Args(), Default().Args())
	}
	// 15090, 15021 and the status port stay excluded whatever -d says.
	c, err = parse("-d", "8080", "--status-port", "15030")
	if err != nil {
		t.Fatal(err)
	}
	if want := []uint16{8080, 15090, 15021, 15030}; !slices.Equal(c.ExcludeInboundPorts, want) {
		t.Errorf("-d 8080: got %v, want %v", c.ExcludeInboundPorts, want)
	}
	for _, bad := range [][]string{{"-p", "0"}, {"-i", "nope"}, {"-x", "*"}, {"-m", "X"}, {"-u", ""}, {"-c", "a b"}, {"--dns-servers", "x"}} {
		if _, err := parse(bad...); err == nil || !strings.Contains(err.Error(), "flag --") {
			t.Errorf("%q: got %v, want an error naming the flag", bad, err)
		}
	}
}
