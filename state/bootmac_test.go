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

// TestServerByBootMACReadsTheHintedRecord: a server written through the
// store is found by its boot MAC by reading its one record (the decode
// cache's MAC hint), not by a scan of every record: a record that cannot
// be decoded yet holds the same MAC bytes, and sorts first, fails the scan
// but not the lookup. A hint gone stale (the MAC moved to another server)
// is checked against the record and the lookup still answers right. Before
// the hint, each newly registered server's first netboot scanned the whole
// fleet.
func TestServerByBootMACReadsTheHintedRecord(t *testing.T) {
	eachEngine(t, func(t *testing.T) {
		st := openTest(t, state.Options{})
		mustCreate(t, st, state.Server{Name: "z", BootMAC: "52:54:00:00:00:01"})
		mustCreate(t, st, state.Server{Name: "y", BootMAC: "52:54:00:00:00:02"})
		if err := state.PutRawServer(st, "a", []byte(`{"name":"a","bootMAC":"52:54:00:00:00:01",`)); err != nil {
			t.Fatal(err)
		}
		if s, err := st.ServerByBootMAC("52:54:00:00:00:01"); err != nil || s.Name != "z" {
			t.Fatalf("ServerByBootMAC = %q, %v; want z from its own record", s.Name, err)
		}
		// The MAC moves from y to z: both hints are checked against the
		// records they name.
		if _, err := st.UpdateServer("y", func(s *state.Server) error { s.BootMAC = "52:54:00:00:00:03"; return nil }); err != nil {
			t.Fatal(err)
		}
		if _, err := st.UpdateServer("z", func(s *state.Server) error { s.BootMAC = "52:54:00:00:00:02"; return nil }); err != nil {
			t.Fatal(err)
		}
		for mac, want := range map[string]string{"52:54:00:00:00:02": "z", "52:54:00:00:00:03": "y"} {
			if s, err := st.ServerByBootMAC(mac); err != nil || s.Name != want {
				t.Errorf("after the moves, ServerByBootMAC(%s) = %q, %v; want %s", mac, s.Name, err, want)
			}
		}
		// The old MAC names z's record, which no longer holds it: the
		// lookup falls back to the scan, which meets the undecodable record.
		if _, err := st.ServerByBootMAC("52:54:00:00:00:01"); err == nil {
			t.Error("ServerByBootMAC of a MAC only the undecodable record holds = nil error; want the scan's decode error")
		}
		if err := state.DeleteRawServer(st, "a"); err != nil { // the store's integrity check at the end
			t.Fatal(err)
		}
	})
}
