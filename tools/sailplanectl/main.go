// Command sailplanectl is Sailplane's command-line tool: it writes client bootstraps and reads
// what a Sailplane bus serves.
package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
)

func main() {
	if err := rootCmd().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "sailplanectl:", err)
		os.Exit(1)
	}
}

func rootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:           "sailplanectl",
		Short:         "Work with a Sailplane control plane",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(bootstrapCmd(), busCmd(), proxyStatusCmd(), proxyConfigCmd(), validateCmd(), analyzeCmd(), gatewayStatusCmd(), tagCmd(), versionCmd())
	return root
}
