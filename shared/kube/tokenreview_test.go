package kube

import (
	"fmt"
	"testing"
	"time"

	"sailplane.dev/shared/spiffe"
)

func TestTokenCacheIsBounded(t *testing.T) {
	r := NewTokenReviewer(nil, TokenReviewOptions{Size: 3})
	now := time.Now()
	r.cache["expired"] = cachedReview{expires: now.Add(-time.Second)}
	r.cache["a"] = cachedReview{expires: now.Add(time.Minute)}
	r.cache["b"] = cachedReview{expires: now.Add(time.Minute)}
	r.evict()
	if _, ok := r.cache["expired"]; ok || len(r.cache) != 2 {
		t.Fatalf("after evict: %v; want the expired entry gone first", r.cache)
	}
	for i := range 10 {
		r.evict()
		r.cache[fmt.Sprint(i)] = cachedReview{id: spiffe.ID{Namespace: "n"}, expires: now.Add(time.Minute)}
		if len(r.cache) > r.opts.Size {
			t.Fatalf("%d entries, bound %d", len(r.cache), r.opts.Size)
		}
	}
}
