package jwks

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"sailplane.dev/shared/testlog"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type sink struct {
	mu      sync.Mutex
	keys    map[string]string
	sets    int
	changed chan struct{} // optional: signalled after each SetJWKS
}

func (s *sink) SetJWKS(uri, keys string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sets++
	if s.changed != nil {
		select {
		case s.changed <- struct{}{}:
		default:
		}
	}
	if s.keys == nil {
		s.keys = map[string]string{}
	}
	if keys == "" {
		delete(s.keys, uri)
		return
	}
	s.keys[uri] = keys
}

func (s *sink) get(uri string) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k, ok := s.keys[uri]
	return k, ok
}

const goodKeys = `{"keys":[{"kty":"RSA","e":"AQAB","n":"xAE7"}]}`

func TestFetchDue(t *testing.T) {
	var doc atomic.Value
	doc.Store(goodKeys)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/keys":
			_, _ = w.Write([]byte(doc.Load().(string)))
		case "/notjwks":
			_, _ = w.Write([]byte(`{"hello":1}`))
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	s := &sink{}
	r := New(s, testlog.New(t, slog.LevelDebug), time.Second, time.Hour, time.Minute)
	good, missing, bad := srv.URL+"/keys", srv.URL+"/missing", srv.URL+"/notjwks"
	r.Want([]string{good, missing, bad})
	now := time.Unix(1000, 0)
	next := r.FetchDue(context.Background(), now)
	if k, _ := s.get(good); k != goodKeys {
		t.Fatalf("fetched %q, want the served document", k)
	}
	for _, u := range []string{missing, bad} {
		k, ok := s.get(u)
		var parsed struct {
			Keys []map[string]string `json:"keys"`
		}
		if !ok || json.Unmarshal([]byte(k), &parsed) != nil || len(parsed.Keys) != 1 || parsed.Keys[0]["kty"] != "EC" {
			t.Fatalf("%s: want a fail-closed EC key, got %q", u, k)
		}
	}
	if want := now.Add(time.Minute); !next.Equal(want) {
		t.Fatalf("next fetch at %v, want the retry at %v", next, want)
	}
	// Nothing is due before then; at refresh time the new document is picked up.
	doc.Store(`{"keys":[{"kty":"RSA","e":"AQAB","n":"AAAA"}]}`)
	sets := s.sets
	r.FetchDue(context.Background(), now.Add(30*time.Second))
	if s.sets != sets {
		t.Fatal("fetched before anything was due")
	}
	r.FetchDue(context.Background(), now.Add(time.Hour))
	if k, _ := s.get(good); k == goodKeys {
		t.Fatal("refresh did not pick up the new keys")
	}
	// A URI no longer wanted is forgotten.
	r.Want([]string{good})
	if _, ok := s.get(bad); ok {
		t.Fatal("dropped URI still has keys")
	}
	if got := r.Wanted(); len(got) != 1 || got[0] != good {
		t.Fatalf("wanted %v", got)
	}
}

func TestRunFetchesNewURIs(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte(goodKeys)) }))
	defer srv.Close()
	s := &sink{changed: make(chan struct{}, 1)}
	r := New(s, testlog.New(t, slog.LevelDebug), time.Second, 0, 0)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = r.Run(ctx)
	}()
	defer func() {
		cancel()
		<-done
	}()
	r.Want([]string{srv.URL})
	timeout := time.After(10 * time.Second)
	for {
		if k, _ := s.get(srv.URL); k == goodKeys {
			return
		}
		select {
		case <-s.changed:
		case <-timeout:
			t.Fatal("keys of a new URI not fetched")
		}
	}
}
