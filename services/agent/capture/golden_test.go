package capture

import (
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
