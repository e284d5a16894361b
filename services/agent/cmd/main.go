// Command agent runs beside each workload: key and CSR, SDS to the proxy, bootstrap, xDS proxy.
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
		Use:           "agent",
		Short:         "Sailplane agent: runs beside each workload: key and CSR, SDS to the proxy, bootstrap, xDS proxy",
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(*cobra.Command, []string) error {
			return errors.New("agent is not implemented yet")
		},
	}
	if err := cmd.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}
