package spiffe

import (
	"go.uber.org/goleak"

	"errors"
	"testing"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want ID
		ok   bool
	}{
		{"spiffe://cluster.local/ns/default/sa/bookinfo", ID{"cluster.local", "default", "bookinfo"}, true},
		{"spiffe://example.org/ns/a-b/sa/c.d", ID{"example.org", "a-b", "c.d"}, true},
		{"https://cluster.local/ns/default/sa/x", ID{}, false},
		{"spiffe:///ns/default/sa/x", ID{}, false},
		{"spiffe://cluster.local/ns/default", ID{}, false},
		{"spiffe://cluster.local/ns//sa/x", ID{}, false},
		{"spiffe://cluster.local/sa/x/ns/default", ID{}, false},
		{"spiffe://cluster.local/ns/default/sa/x/extra", ID{}, false},
		{"spiffe://cluster.local/ns/default/sa/x?q=1", ID{}, false},
		{"spiffe://u@cluster.local/ns/default/sa/x", ID{}, false},
		{"%zz", ID{}, false},
	} {
		got, err := Parse(tc.in)
		if tc.ok != (err == nil) || got != tc.want {
			t.Errorf("Parse(%q) = %+v, %v; want %+v, ok=%v", tc.in, got, err, tc.want, tc.ok)
		}
		if err != nil && !errors.Is(err, ErrInvalid) {
			t.Errorf("Parse(%q) error %v does not wrap ErrInvalid", tc.in, err)
		}
		if tc.ok && got.String() != tc.in {
			t.Errorf("String() = %q, want %q", got.String(), tc.in)
		}
	}
}

func TestFromServiceAccountUser(t *testing.T) {
	id, err := FromServiceAccountUser("cluster.local", "system:serviceaccount:ns1:sa1")
	if err != nil || id != (ID{"cluster.local", "ns1", "sa1"}) {
		t.Fatalf("got %+v, %v", id, err)
	}
	for _, bad := range []string{"system:serviceaccount:ns1", "system:node:n1:x", "alice", "system:serviceaccount::sa", "system:serviceaccount:ns:"} {
		if _, err := FromServiceAccountUser("cluster.local", bad); err == nil {
			t.Errorf("FromServiceAccountUser(%q) accepted", bad)
		}
	}
}

func TestSameWorkload(t *testing.T) {
	a := ID{"a.org", "ns", "sa"}
	if !a.SameWorkload(ID{"b.org", "ns", "sa"}) || a.SameWorkload(ID{"a.org", "ns", "other"}) {
		t.Fatal("SameWorkload wrong")
	}
}

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
