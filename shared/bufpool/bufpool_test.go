package bufpool

import "testing"

func TestDirty(t *testing.T) {
	var p Dirty
	for _, size := range []int{0, 1, 2, 3, 1000, 1024, 1025, 16 << 10, 1 << 24, 1<<24 + 1} {
		b := p.Get(size)
		if len(*b) != size {
			t.Fatalf("Get(%d): length %d", size, len(*b))
		}
		if c := cap(*b); c < size || (size <= 1<<24 && c&(c-1) != 0) {
			t.Fatalf("Get(%d): capacity %d, want a power of two at least %d", size, c, size)
		}
		p.Put(b)
	}
	// Sizes share a tier: a buffer given back for 3000 bytes serves 2500.
	p.Put(p.Get(3000))
	if b := p.Get(2500); cap(*b) != 4096 {
		t.Fatalf("Get(2500): capacity %d, want 4096", cap(*b))
	}
}
