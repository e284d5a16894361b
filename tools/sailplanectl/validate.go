package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"sailplane.dev/shared/config/analyze"
)

// errFound is what validate and analyze return when they found errors: the process exits 1, for
// CI.
var errFound = errors.New("problems found")

// fileFlags are the config files a command reads.
type fileFlags struct {
	paths     []string
	namespace string
}

func (f *fileFlags) add(fs *pflag.FlagSet) {
	fs.StringArrayVarP(&f.paths, "filename", "f", nil, "a YAML or JSON file, a folder (read recursively: *.yaml, *.yml, *.json) or - for stdin; repeatable")
	fs.StringVarP(&f.namespace, "namespace", "n", "default", "namespace of the resources that name none")
}

// configExtensions are the files read from a folder, as config-ingest reads them (plus JSON).
var configExtensions = []string{".yaml", ".yml", ".json"}

// read adds every file to s and returns the problems found reading and validating them.
func (f *fileFlags) read(s *analyze.Set, stdin io.Reader) ([]analyze.Message, int) {
	var msgs []analyze.Message
	files := 0
	add := func(name string, data []byte) {
		files++
		msgs = append(msgs, s.AddFile(name, data, f.namespace)...)
	}
	unreadable := func(name string, err error) {
		msgs = append(msgs, analyze.Message{Level: analyze.Error, File: name, Message: "cannot be read: " + err.Error()})
	}
	for _, p := range f.paths {
		if p == "-" {
			data, err := io.ReadAll(stdin)
			if err != nil {
				unreadable("-", err)
				continue
			}
			add("-", data)
			continue
		}
		root := p
		if fi, err := os.Stat(p); err == nil && fi.IsDir() {
			root = filepath.Clean(p) + string(filepath.Separator) // a symlinked folder is walked too
		}
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				unreadable(path, err)
				return nil
			}
			if path != root && strings.HasPrefix(d.Name(), ".") {
				// Hidden: a ConfigMap volume's ..data and timestamped copies hold the same files
				// as the links beside them.
				if d.IsDir() {
					return fs.SkipDir
				}
				return nil
			}
			if d.IsDir() || path != root && !hasConfigExtension(path) {
				return nil
			}
			data, err := os.ReadFile(path)
			if err != nil {
				unreadable(path, err)
				return nil
			}
			add(path, data)
			return nil
		})
		if err != nil {
			unreadable(p, err)
		}
	}
	return msgs, files
}

func hasConfigExtension(path string) bool {
	return slices.Contains(configExtensions, strings.ToLower(filepath.Ext(path)))
}

func validateCmd() *cobra.Command {
	var files fileFlags
	var warningsAsErrors bool
	var format *string
	cmd := &cobra.Command{
		Use:   "validate -f FILE|DIR|-",
		Short: "Validate Istio config files offline, as config-ingest and the webhook do",
		Long: `Validate Istio config files offline with config-ingest's validator: every message names the
file, the document (1-based, as counted between "---" lines), the resource and the field.
Exit code 1 when any resource is invalid (with --warnings-as-errors, also on warnings); 0 otherwise.`,
		Example: `  sailplanectl validate -f examples/etc/sailplane/conf/
  kubectl get virtualservices -A -o yaml | sailplanectl validate -f -`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if len(files.paths) == 0 {
				return errors.New("no input: give -f FILE, -f DIR or -f -")
			}
			var s analyze.Set
			msgs, n := files.read(&s, cmd.InOrStdin())
			return report(cmd, *format, analyze.Sort(msgs), plural(n, "file"), warningsAsErrors)
		},
	}
	files.add(cmd.Flags())
	cmd.Flags().BoolVar(&warningsAsErrors, "warnings-as-errors", false, "exit 1 on warnings too")
	format = addOutputFlag(cmd)
	return cmd
}

// report prints msgs, found in source ("2 files"), and returns errFound (wrapped with a summary)
// when they hold an error, or a warning with warningsAsErrors.
func report(cmd *cobra.Command, format string, msgs []analyze.Message, source string, warningsAsErrors bool) error {
	errs, warnings := 0, 0
	for _, m := range msgs {
		switch m.Level {
		case analyze.Error:
			errs++
		case analyze.Warning:
			warnings++
		}
	}
	out := cmd.OutOrStdout()
	if len(msgs) == 0 && (format == formatTable || format == "") {
		_, err := fmt.Fprintf(out, "No problems found in %s.\n", source)
		return err
	}
	t := table{header: []string{"LEVEL", "CODE", "RESOURCE", "ORIGIN", "FIELD", "MESSAGE"}}
	for _, m := range msgs {
		t.add(string(m.Level), m.Code, m.Resource(), m.Origin(), m.Field, m.Message)
	}
	if msgs == nil {
		msgs = []analyze.Message{}
	}
	if err := writeOutput(out, format, t, msgs); err != nil {
		return err
	}
	if errs > 0 || warningsAsErrors && warnings > 0 {
		return fmt.Errorf("%w: %s and %s in %s", errFound, plural(errs, "error"), plural(warnings, "warning"), source)
	}
	return nil
}

func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return strconv.Itoa(n) + " " + noun + "s"
}
