package api_test

import (
	"io"
	"net/http"
	"testing"

	"github.com/machina-metal/machina/api"
	"github.com/machina-metal/machina/state"
)

func TestHandleAdminAndPublic(t *testing.T) {
	f := newFixture(t, state.Options{})
	err := f.api.HandleAdmin("POST /api/v1/reconcile", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "actor="+api.Actor(r))
	}))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.api.HandlePublic("GET /boot/ipxe", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "#!ipxe")
	})); err != nil {
		t.Fatal(err)
	}
	if err := f.api.HandlePublic("GET /healthz", http.NotFoundHandler()); err == nil {
		t.Error("conflicting pattern accepted")
	}
	if code, _, body := f.do(t, "POST", "/api/v1/reconcile", f.token, ""); code != 200 || string(body) != "actor=ops" {
		t.Errorf("admin route: %d %s", code, body)
	}
	if code, _, _ := f.do(t, "POST", "/api/v1/reconcile", "", ""); code != 401 {
		t.Errorf("admin route without token: %d", code)
	}
	if code, _, body := f.do(t, "GET", "/boot/ipxe", "", ""); code != 200 || string(body) != "#!ipxe" {
		t.Errorf("public route: %d %s", code, body)
	}
}
