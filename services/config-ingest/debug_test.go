package configingest_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"
)

// TestConfigProblemsEndpoint: /debug/config_problems lists each problem with its file,
// document, resource and field, and the cause apart from the whole message; a problem that is
// not about one resource (an unreadable source) keeps its message.
func TestConfigProblemsEndpoint(t *testing.T) {
	e := start(t, func(e *env) {
		e.write("good.yaml", vsDoc("good", "a", 100))
		e.write("broken.yaml", vsDoc("good2", "b", 100)+"---\n"+vsDoc("broken", "c", -1))
	})
	eventually(t, "the broken weight reported", func() bool { return e.problem("broken.yaml", "weight") != nil })

	h := e.svc.Debug().Endpoints["/debug/config_problems"]
	if h == nil {
		t.Fatal("no /debug/config_problems endpoint")
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/debug/config_problems", nil))
	if rec.Code != http.StatusOK || rec.Header().Get("Content-Type") != "application/json" {
		t.Fatalf("status %d, content type %q: %s", rec.Code, rec.Header().Get("Content-Type"), rec.Body)
	}
	var got []map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil {
		t.Fatalf("%v: %s", err, rec.Body)
	}
	want := map[string]any{
		"file": filepath.Join(e.dir, "broken.yaml"), "document": float64(2), "kind": "VirtualService", "namespace": "default",
		"name": "broken", "field": "spec.http[0].route[0].weight", "message": "must not be negative, got -1",
	}
	if len(got) != 1 {
		t.Fatalf("problems %v, want one", got)
	}
	for k, v := range want {
		if got[0][k] != v {
			t.Errorf("%s = %v, want %v", k, got[0][k], v)
		}
	}
	if got[0]["error"] != e.problem("broken.yaml").Error() {
		t.Errorf("error %q, want the logged message %q", got[0]["error"], e.problem("broken.yaml"))
	}

	// The status page's problems are the same.
	problems := e.svc.Debug().Status.Problems()
	if len(problems) != 1 || problems[0].Resource() != "VirtualService default/broken" || problems[0].Field != "spec.http[0].route[0].weight" {
		t.Errorf("status page problems %+v", problems)
	}
}
