package config

import (
	"os"
	"path/filepath"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// FuzzParseValidate: whatever YAML a user writes, parsing and validating it never panics, and
// every resource that validates survives the bus: its Resource converts back to itself and its
// spec, as the bus encodes it (an Any), decodes to the same message.
func FuzzParseValidate(f *testing.F) {
	files, err := filepath.Glob("testdata/*/input.yaml")
	if err != nil {
		f.Fatal(err)
	}
	examples, err := filepath.Glob("../../examples/etc/sailplane/conf/*/*.yaml")
	if err != nil {
		f.Fatal(err)
	}
	if len(files) == 0 || len(examples) == 0 {
		f.Fatalf("no seeds: %d test inputs, %d examples", len(files), len(examples))
	}
	for _, file := range append(files, examples...) {
		data, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		for _, doc := range SplitDocuments(data) { // one document per seed: the fuzzer mutates less noise
			f.Add(doc)
		}
	}
	f.Add([]byte("---\n--- {}\n...\n"))

	f.Fuzz(func(t *testing.T, data []byte) {
		cfgs, _ := ParseYAML("fuzz.yaml", data, "default")
		for _, c := range cfgs {
			if c.Spec == nil {
				t.Fatalf("parsed %s %s without a spec", c.Kind.Kind, c.BusName())
			}
			if _, err := Validate(c); err != nil {
				continue
			}
			if back := FromResource(c.Kind, c.Resource()); !Equal(back, c) {
				t.Fatalf("%s %s: bus resource converts back to %+v", c.Kind.Kind, c.BusName(), back)
			}
			body, err := anypb.New(c.Spec)
			if err != nil {
				t.Fatalf("%s %s: spec does not encode: %v", c.Kind.Kind, c.BusName(), err)
			}
			decoded, err := body.UnmarshalNew()
			if err != nil {
				t.Fatalf("%s %s: encoded spec does not decode: %v", c.Kind.Kind, c.BusName(), err)
			}
			if !proto.Equal(decoded, c.Spec) {
				t.Fatalf("%s %s: spec decodes to %v, want %v", c.Kind.Kind, c.BusName(), decoded, c.Spec)
			}
		}
	})
}
