package version

import (
	"encoding/json"
	"fmt"
	"io"

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"
)

// Command is the `version` subcommand every Sailplane binary has (cli.Execute adds it): one line
// by default, `-o yaml|json` for scripts.
func Command() *cobra.Command {
	var format string
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print this binary's version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return Write(cmd.OutOrStdout(), format, Get())
		},
	}
	cmd.Flags().StringVarP(&format, "output", "o", "", "output format: empty for one line, yaml or json")
	_ = cmd.RegisterFlagCompletionFunc("output", cobra.FixedCompletions([]string{"yaml", "json"}, cobra.ShellCompDirectiveNoFileComp))
	return cmd
}

// Write prints info in format: "" (one line), "yaml" or "json".
func Write(w io.Writer, format string, info Info) error {
	switch format {
	case "":
		_, err := fmt.Fprintln(w, info.String())
		return err
	case "json":
		b, err := json.MarshalIndent(info, "", "  ")
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(w, "%s\n", b)
		return err
	case "yaml":
		b, err := yaml.Marshal(info)
		if err != nil {
			return err
		}
		_, err = w.Write(b)
		return err
	default:
		return fmt.Errorf("--output %q: want yaml or json (or nothing for one line)", format)
	}
}
