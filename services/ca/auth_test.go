package ca

import (
	"fmt"
	"testing"
	"time"

	"sailplane.dev/shared/spiffe"
)

func TestTokenCacheIsBounded(t *testing.T) {
	r := &tokenReviewer{size: 3, ttl: time.Minute, cache: map[string]cachedReview{}}
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
		if len(r.cache) > r.size {
			t.Fatalf("%d entries, bound %d", len(r.cache), r.size)
		}
	}
}

func TestBearerToken(t *testing.T) {
	for _, tc := range []struct {
		in   []string
		want string
		ok   bool
	}{
		{[]string{"Bearer abc"}, "abc", true},
		{[]string{"Basic x", "Bearer abc"}, "abc", true},
		{[]string{"Bearer "}, "", false},
		{[]string{"bearer abc"}, "", false},
		{nil, "", false},
	} {
		got, ok := bearerToken(tc.in)
		if got != tc.want || ok != tc.ok {
			t.Errorf("bearerToken(%q) = %q, %v", tc.in, got, ok)
		}
	}
}
