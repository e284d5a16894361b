package validation

import (
	"os"
	"testing"

	"sailplane.dev/shared/config"
	"sailplane.dev/shared/schema"
)

// BenchmarkValidate validates the valid golden case's documents (one of each kind) once the
// validators are built: go test -run '^$' -bench Validate ./shared/gatewayapi/validation
func BenchmarkValidate(b *testing.B) {
	data, err := os.ReadFile("testdata/valid/input.yaml")
	if err != nil {
		b.Fatal(err)
	}
	cfgs, errs := config.ParseYAML("input.yaml", data, "default")
	if len(errs) > 0 {
		b.Fatal(errs)
	}
	for _, c := range cfgs {
		if _, err := Validate(c); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	for b.Loop() {
		for _, c := range cfgs {
			_, _ = Validate(c)
		}
	}
	b.ReportMetric(float64(b.N*len(cfgs))/b.Elapsed().Seconds(), "docs/s")
}

// BenchmarkBuild builds every kind's validators (CEL compilation included), what the first
// document of each kind costs.
func BenchmarkBuild(b *testing.B) {
	for b.Loop() {
		for _, k := range schema.GatewayAPI {
			if _, err := newKindValidator(k.Kind); err != nil {
				b.Fatal(err)
			}
		}
	}
}
