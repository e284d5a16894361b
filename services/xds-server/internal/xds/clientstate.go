package xds

// clientState is what a client holds of one type: for each name, the entry (and so the
// version) last sent to it. Most clients hold exactly a cached set (the whole cluster or
// endpoint list every proxy of a scope shares), so the state is that shared, immutable set plus
// this client's differences, rather than a map per connection as large as the set: with
// thousands of connections those maps were the largest part of the server's memory. Keeping
// entries rather than versions is what lets a config dump show what the client holds.
type clientState struct {
	base *set
	// over overrides base: the entry held, or nil for a name of base the client does not hold.
	over map[string]*entry
	n    int // names held
}

// held is the entry the client holds under name, nil when none. An entry whose any is nil
// stands for a version the client said it holds (delta initial_resource_versions) with content
// this server never sent.
func (cs *clientState) held(name string) *entry {
	if e, ok := cs.over[name]; ok {
		return e
	}
	if cs.base != nil {
		return cs.base.entries[name]
	}
	return nil
}

// get is the version held under name, "" when none.
func (cs *clientState) get(name string) string {
	if e := cs.held(name); e != nil {
		return e.version
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

// set records that the client holds e (its version not empty).
func (cs *clientState) set(e *entry) {
	if cs.held(e.name) == nil {
		cs.n++
	}
	if bv, ok := cs.baseVersion(e.name); ok && bv == e.version {
		// Versions hash the encoding: the base's entry is the same resource.
		delete(cs.over, e.name)
		return
	}
	if cs.over == nil {
		cs.over = map[string]*entry{}
	}
	cs.over[e.name] = e
}

// del records that the client does not hold name.
func (cs *clientState) del(name string) {
	if cs.held(name) == nil {
		return
	}
	cs.n--
	if _, ok := cs.baseVersion(name); ok {
		if cs.over == nil {
			cs.over = map[string]*entry{}
		}
		cs.over[name] = nil
		return
	}
	delete(cs.over, name)
}

// names calls f with every name held.
func (cs *clientState) names(f func(name string)) {
	cs.entries(func(e *entry) { f(e.name) })
}

// entries calls f with every entry held: the base's in name order, then the others.
func (cs *clientState) entries(f func(e *entry)) {
	if cs.base != nil {
		for _, n := range cs.base.names {
			e, ok := cs.over[n]
			if !ok {
				e = cs.base.entries[n]
			}
			if e != nil {
				f(e)
			}
		}
	}
	for n, e := range cs.over {
		if e == nil {
			continue
		}
		if _, ok := cs.baseVersion(n); ok {
			continue // listed with base
		}
		f(e)
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
