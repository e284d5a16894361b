// Command webhook injects sidecars into pods and validates Istio config for the Kubernetes API server.
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
		Use:           "webhook",
		Short:         "Sailplane webhook: injects sidecars into pods and validates Istio config for the Kubernetes API server",
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(*cobra.Command, []string) error {
			return errors.New("webhook is not implemented yet")
		},
	}
	if err := cmd.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}
