package cli

import (
	"testing"

	"github.com/spf13/pflag"
)

func TestNamespaceVar(t *testing.T) {
	for _, c := range []struct {
		name, env string
		args      []string
		want      string
	}{
		{name: "default", want: DefaultNamespace},
		{name: "POD_NAMESPACE", env: "mesh", want: "mesh"},
		{name: "flag over POD_NAMESPACE", env: "mesh", args: []string{"--namespace=cp"}, want: "cp"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv("POD_NAMESPACE", c.env)
			// Two services' configs take it, as in hyper: one flag sets both.
			var a, b string
			fs := pflag.NewFlagSet("x", pflag.ContinueOnError)
			NamespaceVar(fs, &a)
			NamespaceVar(fs, &b)
			if err := fs.Parse(c.args); err != nil {
				t.Fatal(err)
			}
			if a != c.want || b != c.want {
				t.Errorf("got %q and %q, want %q", a, b, c.want)
			}
		})
	}
}
