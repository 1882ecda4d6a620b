package fleet

import (
	"context"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/machina-metal/machina/internal/pyghmibmc"
	"github.com/machina-metal/machina/state"
)

// TestSweepIPMICipherSuiteMinimum: pyghmi's Bmc class (VirtualBMC) answers
// every session request with cipher suite 3's algorithms. With the site's
// minimum at 17 the sweep records the BMC as unreadable, naming the suite
// it offered and the minimum; a server whose servers.yaml lowers its
// minimum to 3 (bmc.minCipherSuite, in its record) is read, and the
// algorithms its session negotiated are recorded for status.
func TestSweepIPMICipherSuiteMinimum(t *testing.T) {
	b := pyghmibmc.Start(t, pyghmibmc.Config{})
	st, err := state.Open(filepath.Join(t.TempDir(), "state.db"), state.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for i, name := range []string{"strict", "lowered"} {
		var m uint8
		if name == "lowered" {
			m = 3
		}
		if _, err := st.CreateServer(state.Server{Name: name, Zone: "z", BootMAC: "52:54:00:33:00:0" + string(rune('1'+i)),
			BMC: state.BMCFacts{Driver: "ipmi", Address: b.Addr(), Credentials: "c", MinCipherSuite: m}}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := st.PutSecret("c", state.Credential{Username: "admin", Password: "password"}, "test"); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(t.Output(), nil))
	drivers := &StoreDrivers{Store: st, Logger: log, MinIPMICipherSuite: 17}
	defer drivers.Close(context.Background())
	w := NewSweep(st, drivers, time.Hour, log)
	for _, name := range []string{"strict", "lowered"} {
		w.read(t.Context(), name)
	}
	s, _ := st.Server("strict")
	for _, want := range []string{"below the minimum cipher suite 17", "the BMC answered with cipher suite 3 (RAKP-HMAC-SHA1, HMAC-SHA1-96, AES-CBC-128)"} {
		if !strings.Contains(s.BMCError, want) {
			t.Errorf("strict: BMCError %q lacks %q", s.BMCError, want)
		}
	}
	if s.BMC.Security != "" {
		t.Errorf("strict: Security %q recorded for a refused session", s.BMC.Security)
	}
	s, _ = st.Server("lowered")
	if s.BMCError != "" {
		t.Errorf("lowered: BMCError %q", s.BMCError)
	}
	if want := "cipher suite 3 (RAKP-HMAC-SHA1, HMAC-SHA1-96, AES-CBC-128)"; s.BMC.Security != want {
		t.Errorf("lowered: Security %q, want %q", s.BMC.Security, want)
	}
}
