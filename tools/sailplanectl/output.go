package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"sigs.k8s.io/yaml"
)

// Output formats every command takes with -o: a table for people, yaml or json for scripts.
const (
	formatTable = "table"
	formatYAML  = "yaml"
	formatJSON  = "json"
)

var formats = []string{formatTable, formatYAML, formatJSON}

// addOutputFlag registers -o/--output on cmd, with shell completion of its values.
func addOutputFlag(cmd *cobra.Command) *string {
	format := formatTable
	cmd.Flags().StringVarP(&format, "output", "o", formatTable, "output format: "+strings.Join(formats, "|"))
	_ = cmd.RegisterFlagCompletionFunc("output", cobra.FixedCompletions(formats, cobra.ShellCompDirectiveNoFileComp))
	return &format
}

// table is what a command shows people: a header and rows of cells.
type table struct {
	header []string
	rows   [][]string
}

func (t *table) add(cells ...string) { t.rows = append(t.rows, cells) }

// writeOutput prints t as a table, or data (anything encoding/json takes; see protoValue for
// protobuf messages) as yaml or json. The table and data show the same thing: the table is the
// short form.
func writeOutput(w io.Writer, format string, t table, data any) error {
	switch format {
	case formatTable, "":
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, strings.Join(t.header, "\t"))
		for _, r := range t.rows {
			fmt.Fprintln(tw, strings.Join(r, "\t"))
		}
		return tw.Flush()
	case formatJSON:
		b, err := json.MarshalIndent(data, "", "  ")
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(w, "%s\n", b)
		return err
	case formatYAML:
		js, err := json.Marshal(data)
		if err != nil {
			return err
		}
		b, err := yaml.JSONToYAML(js)
		if err != nil {
			return err
		}
		_, err = w.Write(b)
		return err
	default:
		return fmt.Errorf("--output %q: want one of %s", format, strings.Join(formats, ", "))
	}
}

// protoValue is m in its canonical JSON form (field names as in Istio's and Envoy's docs), for data
// given to writeOutput.
func protoValue(m proto.Message) (json.RawMessage, error) {
	if m == nil {
		return json.RawMessage("null"), nil
	}
	return protojson.Marshal(m)
}
