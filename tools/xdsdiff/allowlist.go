package xdsdiff

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"sigs.k8s.io/yaml"
)

// Entry allows the differences it matches: each field is a glob ("*" any text, "?" one
// character, "\" quotes the next character; empty matches anything). Reason is mandatory.
type Entry struct {
	Case, Node, Type, Resource, Path, Reason string
	// Index is the entry's position in its file, from 1, for reports.
	Index int

	patterns [5]*regexp.Regexp // Case, Node, Type, Resource, Path; nil = any
}

// String names the entry for reports.
func (e Entry) String() string {
	var parts []string
	for i, v := range e.values() {
		if v != "" {
			parts = append(parts, entryKeys[i]+"="+v)
		}
	}
	return fmt.Sprintf("entry %d (%s; reason: %s)", e.Index, strings.Join(parts, " "), e.Reason)
}

var entryKeys = [5]string{"case", "node", "type", "resource", "path"}

func (e Entry) values() [5]string { return [5]string{e.Case, e.Node, e.Type, e.Resource, e.Path} }

func (e *Entry) covers(d Difference) bool {
	for i, v := range [5]string{d.Case, d.Node, d.Type, d.Resource, d.Path} {
		if e.patterns[i] != nil && !e.patterns[i].MatchString(v) {
			return false
		}
	}
	return true
}

// Allowlist is the set of differences from istiod that are known and explained.
type Allowlist struct {
	File    string
	Entries []Entry
}

// LoadAllowlist reads a YAML list of entries:
//
//   - type: LDS
//     resource: virtualOutbound
//     path: "filter_chains[*].filters[tcp_proxy].idle_timeout"
//     reason: istiod sets Istio's 1h default explicitly; ours leaves Envoy's, also 1h.
//
// Errors name the file, the entry (from 1) and the field.
func LoadAllowlist(path string) (*Allowlist, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var raw []map[string]any
	if err := yaml.Unmarshal(data, &raw); err != nil {
		return nil, fmt.Errorf("%s: not a YAML list of entries: %w", path, err)
	}
	a := &Allowlist{File: path}
	for i, r := range raw {
		e, err := parseEntry(r)
		if err != nil {
			return nil, fmt.Errorf("%s: entry %d: %w", path, i+1, err)
		}
		e.Index = i + 1
		a.Entries = append(a.Entries, e)
	}
	return a, nil
}

func parseEntry(r map[string]any) (Entry, error) {
	var e Entry
	var vals [5]string
	keys := slices.Sorted(maps.Keys(r)) // the first error of an entry is always the same one
	for _, k := range keys {
		s, err := scalarText(r[k])
		if err != nil {
			return e, fmt.Errorf("field %q: %w", k, err)
		}
		switch i := slices.Index(entryKeys[:], k); {
		case i >= 0:
			vals[i] = s
		case k == "reason":
			e.Reason = strings.TrimSpace(s)
		default:
			return e, fmt.Errorf("unknown field %q (want case, node, type, resource, path, reason)", k)
		}
	}
	e.Case, e.Node, e.Type, e.Resource, e.Path = vals[0], vals[1], vals[2], vals[3], vals[4]
	if e.Reason == "" {
		return e, errors.New(`field "reason": missing; say why this difference is expected`)
	}
	some := false
	for i, v := range vals {
		if v == "" {
			continue
		}
		some = true
		re, err := glob(v)
		if err != nil {
			return e, fmt.Errorf("field %q: %w", entryKeys[i], err)
		}
		e.patterns[i] = re
	}
	if !some {
		return e, errors.New("no case, node, type, resource or path: it would allow every difference")
	}
	return e, nil
}

// scalarText accepts numbers too: a route configuration named 8080 is written resource: 8080.
func scalarText(v any) (string, error) {
	switch v := v.(type) {
	case string:
		return v, nil
	case float64:
		return strconv.FormatFloat(v, 'f', -1, 64), nil
	}
	return "", fmt.Errorf("want a string, got %T", v)
}

// glob compiles a pattern where "*" is any text (brackets and slashes included: paths are full of
// them), "?" one character and "\" quotes the next.
func glob(p string) (*regexp.Regexp, error) {
	var b strings.Builder
	b.WriteString("^")
	for i := 0; i < len(p); i++ {
		switch c := p[i]; c {
		case '*':
			b.WriteString(".*")
		case '?':
			b.WriteString(".")
		case '\\':
			if i+1 == len(p) {
				return nil, fmt.Errorf("bad glob %q: ends in a lone \\", p)
			}
			i++
			b.WriteString(regexp.QuoteMeta(p[i : i+1]))
		default:
			b.WriteString(regexp.QuoteMeta(p[i : i+1]))
		}
	}
	b.WriteString("$")
	return regexp.Compile(b.String())
}

// Filter returns the differences no entry covers, and the entries that covered none (stale:
// the difference they explained is gone, so the entry should go too).
func (a *Allowlist) Filter(diffs []Difference) (unexpected []Difference, unused []Entry) {
	used := make([]bool, len(a.Entries))
	for _, d := range diffs {
		covered := false
		for i := range a.Entries {
			if a.Entries[i].covers(d) {
				used[i], covered = true, true
			}
		}
		if !covered {
			unexpected = append(unexpected, d)
		}
	}
	for i, u := range used {
		if !u {
			unused = append(unused, a.Entries[i])
		}
	}
	return unexpected, unused
}
