// Command stamped is a binary built by TestLinkerStamp with -X …version.Version: its `version`
// subcommand comes from cli.Execute, as every Sailplane binary's does.
package main

import (
	"github.com/spf13/cobra"

	"sailplane.dev/shared/cli"
)

func main() { cli.Execute(&cobra.Command{Use: "stamped", Run: func(*cobra.Command, []string) {}}) }
