package xdsdiff

import (
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strings"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
)

// RenameAddresses returns s with every occurrence of the addresses of names, in any string
// property (listener names and addresses, domains, ...), replaced by its name. Two control
// planes may rightly give one host different addresses: istiod allocates ServiceEntry
// addresses in creation order, Sailplane by hash. Renamed after each side's own name table,
// both snapshots say the same thing where they agree. Addresses are matched whole: 240.240.0.1
// is not renamed inside 240.240.0.10. s is not modified.
func RenameAddresses(s Snapshot, names map[string]string) (Snapshot, error) {
	if len(names) == 0 {
		return s, nil
	}
	r, err := newRenamer(names)
	if err != nil {
		return nil, err
	}
	out := Snapshot{}
	for url, list := range s {
		for i, a := range list {
			b, err := r.any(a)
			if err != nil {
				return nil, fmt.Errorf("%s resource %d: %w", url, i, err)
			}
			out[url] = append(out[url], b)
		}
	}
	return out, nil
}

type renamer struct {
	re    *regexp.Regexp
	names map[string]string
}

func newRenamer(names map[string]string) (*renamer, error) {
	addrs := make([]string, 0, len(names))
	for a := range names {
		if _, err := netip.ParseAddr(a); err != nil {
			return nil, fmt.Errorf("rename %q: not an IP address", a)
		}
		addrs = append(addrs, regexp.QuoteMeta(a))
	}
	// Longest first, so that an address is not taken for the start of a longer one.
	slices.SortFunc(addrs, func(a, b string) int { return len(b) - len(a) })
	return &renamer{re: regexp.MustCompile(strings.Join(addrs, "|")), names: names}, nil
}

// text renames the whole addresses in v: a match next to a character that would continue an
// address (a digit, a dot, a hex digit or colon for IPv6) is part of another one.
func (r *renamer) text(v string) string {
	locs := r.re.FindAllStringIndex(v, -1)
	if locs == nil {
		return v
	}
	var b strings.Builder
	last := 0
	for _, l := range locs {
		match := v[l[0]:l[1]]
		v6 := strings.Contains(match, ":")
		if (l[0] > 0 && continuesAddress(v[l[0]-1], v6)) || (l[1] < len(v) && continuesAddress(v[l[1]], v6)) {
			continue
		}
		b.WriteString(v[last:l[0]])
		b.WriteString(r.names[match])
		last = l[1]
	}
	b.WriteString(v[last:])
	return b.String()
}

func continuesAddress(c byte, v6 bool) bool {
	switch {
	case c >= '0' && c <= '9', c == '.':
		return true
	case v6:
		return c == ':' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
	}
	return false
}

func (r *renamer) any(a *anypb.Any) (*anypb.Any, error) {
	m, err := a.UnmarshalNew()
	if err != nil {
		// A type this package does not link is compared by hash anyway: left as it is.
		return a, nil //nolint:nilerr // see above
	}
	if err := r.message(m.ProtoReflect()); err != nil {
		return nil, err
	}
	return anypb.New(m)
}

// message renames in place, in string fields, lists and maps of strings, and nested messages,
// Anys included.
func (r *renamer) message(m protoreflect.Message) error {
	if a, ok := m.Interface().(*anypb.Any); ok {
		b, err := r.any(a)
		if err != nil {
			return err
		}
		proto.Reset(a)
		a.TypeUrl, a.Value = b.GetTypeUrl(), b.GetValue()
		return nil
	}
	var err error
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsList():
			l := v.List()
			for i := range l.Len() {
				switch fd.Kind() {
				case protoreflect.StringKind:
					l.Set(i, protoreflect.ValueOfString(r.text(l.Get(i).String())))
				case protoreflect.MessageKind, protoreflect.GroupKind:
					err = r.message(l.Get(i).Message())
				}
			}
		case fd.IsMap():
			mp := v.Map()
			mp.Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
				switch fd.MapValue().Kind() {
				case protoreflect.StringKind:
					mp.Set(k, protoreflect.ValueOfString(r.text(mv.String())))
				case protoreflect.MessageKind, protoreflect.GroupKind:
					err = r.message(mv.Message())
				}
				return err == nil
			})
		case fd.Kind() == protoreflect.StringKind:
			m.Set(fd, protoreflect.ValueOfString(r.text(v.String())))
		case fd.Kind() == protoreflect.MessageKind || fd.Kind() == protoreflect.GroupKind:
			err = r.message(v.Message())
		}
		return err == nil
	})
	return err
}
