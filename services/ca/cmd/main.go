// Command ca signs workload certificates (Istio's CreateCertificate API) and publishes the trust bundle.
// It is not built yet: the binary exists so the layout, build and deployment are complete, and it
// says so instead of pretending to work.
package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"
)

func main() {
	cmd := &cobra.Command{
		Use:           "ca",
		Short:         "Sailplane ca: signs workload certificates (Istio's CreateCertificate API) and publishes the trust bundle",
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(*cobra.Command, []string) error {
			return errors.New("ca is not implemented yet")
		},
	}
	if err := cmd.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}
