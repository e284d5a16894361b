package capture

import (
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/spf13/pflag"
	"go.uber.org/goleak"
	"sigs.k8s.io/yaml"

	shared "sailplane.dev/shared/capture"
	"sailplane.dev/shared/golden"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// goldenCase is a testdata/<case>/input.yaml: the flags of `agent capture` and the facts of
// the pod's namespace.
type goldenCase struct {
	Args []string `json:"args"`
	IPv6 bool     `json:"ipv6"`
	// ResolvConf are the pod's DNS servers (what DNS capture reads from resolv.conf).
	ResolvConf []string `json:"resolvConf"`
	// IstioArgs, when set, are the flags that give Istio's istio-iptables the same capture,
	// where ours differ on purpose (the case says why); else Istio gets the injection
	// template's defaults followed by Args.
	IstioArgs []string `json:"istioArgs"`
	// IstioNFTDiffers says why our nftables rules differ from Istio's there: the test then
	// expects a difference, so one that goes away is noticed.
	IstioNFTDiffers string `json:"istioNFTDiffers"`
}

func loadCase(t *testing.T, dir string) (goldenCase, shared.Config) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(dir, "input.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var gc goldenCase
	if err := yaml.UnmarshalStrict(raw, &gc); err != nil {
		t.Fatalf("%s/input.yaml: %v", dir, err)
	}
	cfg, err := parseArgs(gc.Args)
	if err != nil {
		t.Fatalf("%s/input.yaml: %v", dir, err)
	}
	if cfg.DNS && !cfg.CaptureAllDNS && len(cfg.DNSServers) == 0 {
		for _, s := range gc.ResolvConf {
			cfg.DNSServers = append(cfg.DNSServers, netip.MustParseAddr(s))
		}
	}
	return gc, cfg
}

func parseArgs(args []string) (shared.Config, error) {
	var f shared.Flags
	fs := pflag.NewFlagSet("capture", pflag.ContinueOnError)
	f.AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		return shared.Config{}, err
	}
	return f.Config()
}

// TestGolden pins the rule text of each case: iptables-restore input per family and the
// nftables transaction.
func TestGolden(t *testing.T) {
	for _, dir := range golden.Cases(t, "testdata") {
		t.Run(filepath.Base(dir), func(t *testing.T) {
			gc, cfg := loadCase(t, dir)
			r := Build(cfg, Options{IPv6: gc.IPv6})
			ipt := "# IPv4\n" + r.IPTables(V4)
			if gc.IPv6 {
				ipt += "# IPv6\n" + r.IPTables(V6)
			}
			golden.Compare(t, filepath.Join(dir, "iptables.golden"), []byte(ipt))
			golden.Compare(t, filepath.Join(dir, "nftables.golden"), []byte(r.NFTText()))
		})
	}
}
