// Command gen writes schemas.gen.json, what package validation embeds: the v1 OpenAPI schema
// (with its CEL rules) of every Gateway API CRD of a folder, without the descriptions, which
// are most of the CRDs' size and play no part in validation. `make crds` runs it over
// deploy/crds/gateway-api:
//
//	go run ./shared/gatewayapi/validation/gen deploy/crds/gateway-api > shared/gatewayapi/validation/schemas.gen.json
package main

import (
	"fmt"
	"os"

	"sailplane.dev/shared/gatewayapi/validation/internal/schemafile"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: gen <folder of Gateway API CRD YAML files>")
		os.Exit(2)
	}
	f, err := schemafile.Read(os.DirFS(os.Args[1]))
	var out []byte
	if err == nil {
		out, err = f.Encode()
	}
	if err == nil {
		_, err = os.Stdout.Write(out)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "gen:", err)
		os.Exit(1)
	}
}
