package api_test

import (
	"context"
	"net"
	"net/http/httptest"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/machina-metal/machina/api"
	"github.com/machina-metal/machina/boot/ipxe"
	"github.com/machina-metal/machina/state"
)

var scriptToken = regexp.MustCompile(`machina\.token=([A-Za-z0-9_-]+)`)

// TestPreparedScriptToken: the iPXE handler over the store hands out the
// token Prepare minted (the executor's netboot) with no commit on the
// script request; the token works once; the next script request of the
// same machine mints (a commit) and revokes it, as every script request
// did before; a machine nobody prepared for mints inline.
func TestPreparedScriptToken(t *testing.T) {
	st, err := state.Open(filepath.Join(t.TempDir(), "state.db"), state.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for _, s := range []state.Server{
		{Name: "c1", BootMAC: "52:54:00:00:07:01", Lifecycle: state.LifecycleCommissioning, BootMode: "bios"},
		{Name: "c2", BootMAC: "52:54:00:00:07:02", Lifecycle: state.LifecycleCommissioning, BootMode: "bios"},
		{Name: "r1", BootMAC: "52:54:00:00:07:03", Lifecycle: state.LifecycleReady, BootMode: "bios"},
	} {
		if _, err := st.CreateServer(s); err != nil {
			t.Fatal(err)
		}
	}
	idx, err := api.NewBootIndex(st)
	if err != nil {
		t.Fatal(err)
	}
	h, err := ipxe.New(ipxe.Config{Lookup: idx, Tokens: idx, ControllerURL: "http://10.99.0.1:8080"})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	ctx := context.Background()
	mac := func(s string) net.HardwareAddr { m, _ := net.ParseMAC(s); return m }
	get := func(m string) string {
		t.Helper()
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", "/boot/ipxe?mac="+m+"&platform=pcbios", nil))
		if rec.Code != 200 {
			t.Fatalf("GET script for %s: %d %s", m, rec.Code, rec.Body)
		}
		sm := scriptToken.FindStringSubmatch(rec.Body.String())
		if sm == nil {
			t.Fatalf("no token in the script for %s:\n%s", m, rec.Body)
		}
		return sm[1]
	}

	if ok, err := h.Prepare(ctx, mac("52:54:00:00:07:03")); err != nil || ok {
		t.Fatalf("Prepare for a ready server = %v, %v; want nothing minted", ok, err)
	}
	if ok, err := h.Prepare(ctx, mac("52:54:00:00:07:01")); err != nil || !ok {
		t.Fatalf("Prepare = %v, %v", ok, err)
	}
	w0, t0 := st.Writes(), time.Now()
	tok := get("52-54-00-00-07-01")
	// The LastHeard note is written behind (state.HeardDelay later): only
	// a check made before it can be due proves the request wrote nothing.
	if w1 := st.Writes(); w1 != w0 && time.Since(t0) < state.HeardDelay/2 {
		t.Errorf("the script request with a prepared token committed (%d page writes)", w1-w0)
	}
	if err := idx.Consume(ctx, mac("52:54:00:00:07:01"), ipxe.PurposeCommission, tok); err != nil {
		t.Fatalf("the prepared token from the script is refused: %v", err)
	}
	w0 = st.Writes()
	tok2 := get("52-54-00-00-07-01")
	if tok2 == tok {
		t.Fatal("a second script request got the prepared token again")
	}
	if st.Writes() == w0 {
		t.Error("the second script request minted nothing (no commit)")
	}
	// Not prepared (a controller restarted since the netboot): inline.
	w0 = st.Writes()
	tok3 := get("52-54-00-00-07-02")
	if st.Writes() == w0 {
		t.Error("a script request with nothing prepared committed nothing")
	}
	if err := idx.Consume(ctx, mac("52:54:00:00:07:02"), ipxe.PurposeCommission, tok3); err != nil {
		t.Fatalf("the inline token is refused: %v", err)
	}
}
