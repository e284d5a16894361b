package xds

// clientState is what a client holds of one type, name -> version. Most clients hold exactly
// a cached set (the whole cluster or endpoint list every proxy of a scope shares), so the state
// is that shared, immutable set plus this client's differences, rather than a map per
// connection as large as the set: with thousands of connections those maps were the largest
// part of the server's memory.
type clientState struct {
	base *set
	// over overrides base: a version, or "" for a name of base the client does not hold.
	over map[string]string
	n    int // names held
}

func (cs *clientState) get(name string) string {
	if v, ok := cs.over[name]; ok {
		return v
	}
	if cs.base != nil {
		if e := cs.base.entries[name]; e != nil {
			return e.version
		}
	}
	return ""
}

func (cs *clientState) baseVersion(name string) (string, bool) {
	if cs.base == nil {
		return "", false
	}
	e := cs.base.entries[name]
	if e == nil {
		return "", false
	}
	return e.version, true
}

// set records that the client holds version (not empty) of name.
func (cs *clientState) set(name, version string) {
	if cs.get(name) == "" {
		cs.n++
	}
	if bv, ok := cs.baseVersion(name); ok && bv == version {
		delete(cs.over, name)
		return
	}
	if cs.over == nil {
		cs.over = map[string]string{}
	}
	cs.over[name] = version
}

// del records that the client does not hold name.
func (cs *clientState) del(name string) {
	if cs.get(name) == "" {
		return
	}
	cs.n--
	if _, ok := cs.baseVersion(name); ok {
		if cs.over == nil {
			cs.over = map[string]string{}
		}
		cs.over[name] = ""
		return
	}
	delete(cs.over, name)
}

// names calls f with every name held.
func (cs *clientState) names(f func(name string)) {
	if cs.base != nil {
		for _, n := range cs.base.names {
			if v, ok := cs.over[n]; ok && v == "" {
				continue
			}
			f(n)
		}
	}
	for n, v := range cs.over {
		if v == "" {
			continue
		}
		if _, ok := cs.baseVersion(n); ok {
			continue // listed with base
		}
		f(n)
	}
}

// rebase makes st the base when the client holds exactly st, dropping the differences; done
// after a response covering st, or when differences pile up.
func (cs *clientState) rebase(st *set) {
	if st == nil || cs.base == st && len(cs.over) == 0 {
		return
	}
	if cs.n != len(st.names) {
		return
	}
	for _, n := range st.names {
		if cs.get(n) != st.entries[n].version {
			return
		}
	}
	cs.base, cs.over = st, nil
}
