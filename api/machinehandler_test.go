package api

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/state"
)

// TestMachineHandlerRefusesAdminRoutes checks the handler of the plain,
// off-loopback listener: machine-facing and unauthenticated built-in
// routes are served, every admin route and operator page answers 403
// tls_required naming the TLS URL, before looking at any token (a valid
// one is refused too).
func TestMachineHandlerRefusesAdminRoutes(t *testing.T) {
	st, err := state.Open(filepath.Join(t.TempDir(), "state.db"), state.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	srv, err := New(Config{Store: st})
	if err != nil {
		t.Fatal(err)
	}
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("served")) })
	if err := srv.HandlePublic("GET /boot/ipxe", ok); err != nil {
		t.Fatal(err)
	}
	if err := srv.HandleOperator("/ui/", ok); err != nil {
		t.Fatal(err)
	}
	if err := srv.HandleAdmin("POST /api/v1/reconcile", ok); err != nil {
		t.Fatal(err)
	}
	srv.SetAdminURL("https://machina.example:8444")
	tok, _, err := st.CreateAdminToken("ops", state.ActorLocal)
	if err != nil {
		t.Fatal(err)
	}
	machine := httptest.NewServer(srv.MachineHandler())
	defer machine.Close()
	full := httptest.NewServer(srv.Handler())
	defer full.Close()
	for _, tc := range []struct {
		method, path string
		machineCode  int
	}{
		{"GET", "/healthz", 200},
		{"GET", "/metrics", 200},
		{"GET", "/boot/ipxe", 200},
		{"GET", "/api/v1/status", 403},
		{"GET", "/api/v1/state/snapshot", 403},
		{"PUT", "/api/v1/secrets/bmc", 403},
		{"POST", "/api/v1/reconcile", 403},
		{"GET", "/ui/", 403},
		{"GET", "/no/such/path", 404},
	} {
		req, _ := http.NewRequest(tc.method, machine.URL+tc.path, strings.NewReader("{}"))
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var e v1.Error
		_ = json.NewDecoder(resp.Body).Decode(&e)
		resp.Body.Close()
		if resp.StatusCode != tc.machineCode {
			t.Errorf("machine listener %s %s = %d, want %d", tc.method, tc.path, resp.StatusCode, tc.machineCode)
		}
		if tc.machineCode == 403 && (e.Code != v1.CodeTLSRequired || !strings.Contains(e.Message, "https://machina.example:8444")) {
			t.Errorf("%s %s: error %+v, want tls_required naming the TLS URL", tc.method, tc.path, e)
		}
		// The full handler (TLS listener, or loopback) serves them all.
		req, _ = http.NewRequest(tc.method, full.URL+tc.path, strings.NewReader(`{"username":"a","password":"b"}`))
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err = http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if tc.machineCode == 403 && resp.StatusCode == 403 {
			t.Errorf("full handler %s %s = 403", tc.method, tc.path)
		}
	}
}
