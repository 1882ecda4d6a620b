package api_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/state"
)

// FuzzTransitionBody feeds arbitrary bodies to the transition endpoint:
// the answer is always a JSON body with a 200, 400, 409 or 413 status, and
// the stored lifecycle always equals the last answered 200's lifecycle.
func FuzzTransitionBody(f *testing.F) {
	for _, s := range []string{`{"from":"new","to":"commissioning"}`, `{"from":"commissioning","to":"ready","reason":"ok"}`,
		`{"from":"new","to":"deployed"}`, `{}`, `{"from":1}`, `[`, `{"from":"new","to":"commissioning"} x`, ""} {
		f.Add(s)
	}
	fx := newFixture(f, state.Options{NoSync: true})
	if _, err := fx.store.CreateServer(state.Server{Name: "fz"}); err != nil {
		f.Fatal(err)
	}
	h := fx.api.Handler()
	f.Fuzz(func(t *testing.T, body string) {
		if len(body) > 1<<17 {
			return
		}
		req := httptest.NewRequest("POST", "/api/v1/servers/fz/transitions", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+fx.token)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		switch rec.Code {
		case http.StatusOK:
			var srv v1.Server
			if err := json.Unmarshal(rec.Body.Bytes(), &srv); err != nil {
				t.Fatalf("200 body %q: %v", rec.Body, err)
			}
			stored, err := fx.store.Server("fz")
			if err != nil || string(stored.Lifecycle) != srv.Lifecycle {
				t.Fatalf("stored %v, answered %s", stored.Lifecycle, srv.Lifecycle)
			}
		case http.StatusBadRequest, http.StatusConflict, http.StatusRequestEntityTooLarge:
			var e v1.Error
			if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil || e.Code == "" {
				t.Fatalf("%d body %q: %v", rec.Code, rec.Body, err)
			}
		default:
			t.Fatalf("status %d for body %q: %s", rec.Code, body, rec.Body)
		}
	})
}
