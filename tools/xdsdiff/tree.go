package xdsdiff

import (
	"fmt"
	"slices"
	"sort"
	"strings"
)

// A projected resource is a tree of plain values:
//
//   - string: a leaf property;
//   - fields: a message's properties by name, shown in a path as ".name";
//   - keyed: items identified by a key, where Envoy does not care about their order ("[key]");
//   - ordered: keyed items whose order Envoy honours (first match wins, filters run in order):
//     their items are compared by key as for keyed, and their order separately.
type (
	fields  map[string]any
	keyed   map[string]any
	ordered struct {
		keys  []string
		items map[string]any
	}
)

// add appends an item under key, made unique when two items share it (Istio sends two RBAC
// filters, say: rbac and rbac#2).
func (o *ordered) add(key string, v any) {
	if o.items == nil {
		o.items = map[string]any{}
	}
	k := key
	for n := 2; o.items[k] != nil; n++ {
		k = fmt.Sprintf("%s#%d", key, n)
	}
	o.keys = append(o.keys, k)
	o.items[k] = v
}

// addKeyed is add for an unordered collection.
func addKeyed(m keyed, key string, v any) {
	k := key
	for n := 2; m[k] != nil; n++ {
		k = fmt.Sprintf("%s#%d", key, n)
	}
	m[k] = v
}

const absent = "<absent>"

// differ walks two trees, reporting each differing leaf or subtree through emit and counting
// the leaf properties compared.
type differ struct {
	emit   func(path, istiod, ours string)
	leaves int
}

func (d *differ) diff(path string, a, b any) {
	switch {
	case a == nil && b == nil:
		return
	case a == nil || b == nil:
		d.leaves += countLeaves(a) + countLeaves(b)
		d.emit(path, render(a), render(b))
		return
	}
	switch a := a.(type) {
	case string:
		d.leaves++
		if b, ok := b.(string); !ok || a != b {
			d.emit(path, a, render(b))
		}
		return
	case fields:
		if b, ok := b.(fields); ok {
			for _, k := range unionKeys(a, b) {
				d.diff(join(path, k), a[k], b[k])
			}
			if len(a) == 0 && len(b) == 0 {
				d.leaves++ // an empty message is one property: its presence
			}
			return
		}
	case keyed:
		if b, ok := b.(keyed); ok {
			for _, k := range unionKeys(a, b) {
				d.diff(path+"["+k+"]", a[k], b[k])
			}
			return
		}
	case *ordered:
		if b, ok := b.(*ordered); ok {
			d.leaves++
			if ca, cb := common(a.keys, b.items), common(b.keys, a.items); !slices.Equal(ca, cb) {
				d.emit(path+" (order)", bracketed(ca), bracketed(cb))
			}
			for _, k := range unionKeys(a.items, b.items) {
				d.diff(path+"["+k+"]", a.items[k], b.items[k])
			}
			return
		}
	}
	// Different shapes (a leaf on one side, a message on the other).
	d.leaves += countLeaves(a) + countLeaves(b)
	d.emit(path, render(a), render(b))
}

func join(path, field string) string {
	if path == "" {
		return field
	}
	return path + "." + field
}

// common keeps the keys that the other side also has, in this side's order: an item present on
// one side only is reported once, as absent, not again as an order change.
func common(keys []string, other map[string]any) []string {
	var out []string
	for _, k := range keys {
		if _, ok := other[k]; ok {
			out = append(out, k)
		}
	}
	return out
}

func unionKeys[M ~map[string]any](a, b M) []string {
	ks := make([]string, 0, len(a)+len(b))
	for k := range a {
		ks = append(ks, k)
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			ks = append(ks, k)
		}
	}
	sort.Strings(ks)
	return ks
}

func countLeaves(v any) int {
	switch v := v.(type) {
	case nil:
		return 0
	case string:
		return 1
	case fields:
		return max(1, countMap(v))
	case keyed:
		return countMap(v)
	case *ordered:
		return 1 + countMap(v.items)
	}
	return 1
}

func countMap[M ~map[string]any](m M) int {
	n := 0
	for _, v := range m {
		n += countLeaves(v)
	}
	return n
}

// maxRender bounds the text of one value in a report: a whole missing listener is better
// summarised than printed.
const maxRender = 600

// render prints a value compactly and deterministically, for reports and for keys.
func render(v any) string {
	if v == nil {
		return absent
	}
	var b strings.Builder
	renderTo(&b, v)
	if b.Len() > maxRender {
		return b.String()[:maxRender] + fmt.Sprintf("… (%d properties)", countLeaves(v))
	}
	return b.String()
}

func renderTo(b *strings.Builder, v any) {
	switch v := v.(type) {
	case string:
		b.WriteString(v)
	case fields:
		renderMap(b, v, "{", "}", false)
	case keyed:
		renderMap(b, v, "{", "}", true)
	case *ordered:
		b.WriteString("[")
		for i, k := range v.keys {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString("[" + k + "]: ")
			renderTo(b, v.items[k])
		}
		b.WriteString("]")
	}
}

// renderMap prints fields as {name: value} and keyed items as {[key]: value}.
func renderMap[M ~map[string]any](b *strings.Builder, m M, open, close string, item bool) {
	b.WriteString(open)
	for i, k := range unionKeys(m, nil) {
		if i > 0 {
			b.WriteString(", ")
		}
		label := k
		if item {
			label = "[" + k + "]"
		}
		b.WriteString(label + ": ")
		renderTo(b, m[k])
	}
	b.WriteString(close)
}

func bracketed(keys []string) string {
	return "[" + strings.Join(keys, "] [") + "]"
}
