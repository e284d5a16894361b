// Package bufpool is a gRPC buffer pool (google.golang.org/grpc/mem.BufferPool) that does not
// clear the buffers it hands out again. gRPC's own pools clear every buffer they give, so that
// a bug reading past what was written cannot leak an earlier message; where gRPC or our codecs
// only ever read what they wrote into a buffer first (received frames, a message joined from
// its frames), the clearing is pure cost: at thousands of streams it was a tenth of the CPU of
// receiving.
package bufpool

import (
	"math/bits"
	"sync"

	"google.golang.org/grpc/mem"
)

// Dirty pools buffers by power-of-two capacity, up to 16 MiB; larger ones are not pooled.
// The zero value is ready to use.
type Dirty struct {
	tiers [25]sync.Pool // tier t holds buffers of capacity 1<<t
}

var _ mem.BufferPool = (*Dirty)(nil)

// Get returns a buffer of length size, its content whatever it held before.
func (p *Dirty) Get(size int) *[]byte {
	t := tier(size)
	if t >= len(p.tiers) {
		b := make([]byte, size)
		return &b
	}
	if b, ok := p.tiers[t].Get().(*[]byte); ok {
		*b = (*b)[:size]
		return b
	}
	b := make([]byte, size, 1<<t)
	return &b
}

// Put gives b back; buffers not of a tier's capacity are dropped.
func (p *Dirty) Put(b *[]byte) {
	c := cap(*b)
	if t := tier(c); t < len(p.tiers) && c == 1<<t {
		p.tiers[t].Put(b)
	}
}

// tier is the smallest t with 1<<t >= size.
func tier(size int) int { return bits.Len(uint(max(size, 1) - 1)) }
