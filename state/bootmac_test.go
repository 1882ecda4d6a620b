package state_test

import (
	"errors"
	"testing"

	"github.com/machina-metal/machina/state"
)

// TestServerByBootMAC: found by its stored (normalised) MAC, followed after
// a MAC change, ErrNotFound for an unknown or empty MAC; a MAC that appears
// in another field of a record does not match.
func TestServerByBootMAC(t *testing.T) {
	eachEngine(t, func(t *testing.T) {
		st := openTest(t, state.Options{})
		mustCreate(t, st, state.Server{Name: "a", BootMAC: "52:54:00:00:00:01"})
		mustCreate(t, st, state.Server{Name: "b", BootMAC: "52-54-00-00-00-02", LastError: `"bootMAC":"52:54:00:00:00:09"`})
		for mac, want := range map[string]string{"52:54:00:00:00:01": "a", "52:54:00:00:00:02": "b"} {
			s, err := st.ServerByBootMAC(mac)
			if err != nil || s.Name != want {
				t.Errorf("ServerByBootMAC(%s) = %q, %v; want %s", mac, s.Name, err, want)
			}
		}
		for _, mac := range []string{"52:54:00:00:00:09", "", "52:54:00:00:00:03"} {
			if s, err := st.ServerByBootMAC(mac); !errors.Is(err, state.ErrNotFound) {
				t.Errorf("ServerByBootMAC(%q) = %q, %v; want ErrNotFound", mac, s.Name, err)
			}
		}
		if _, err := st.UpdateServer("a", func(s *state.Server) error { s.BootMAC = "52:54:00:00:00:03"; return nil }); err != nil {
			t.Fatal(err)
		}
		if s, err := st.ServerByBootMAC("52:54:00:00:00:03"); err != nil || s.Name != "a" {
			t.Errorf("after the MAC change: %q, %v; want a", s.Name, err)
		}
		if _, err := st.ServerByBootMAC("52:54:00:00:00:01"); !errors.Is(err, state.ErrNotFound) {
			t.Errorf("old MAC still found: %v", err)
		}
	})
}
