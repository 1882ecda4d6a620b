package state_test

import (
	"path/filepath"
	"testing"

	"github.com/machina-metal/machina/state"
)

// TestServersGen: every write of a server record moves the generation the
// boot index caches on; reads and writes of other records do
// not; etcd gives none.
func TestServersGen(t *testing.T) {
	st, err := state.Open(filepath.Join(t.TempDir(), "state.db"), state.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	gen := func() uint64 {
		g, ok := st.ServersGen()
		if !ok {
			t.Fatal("bbolt gives no ServersGen")
		}
		return g
	}
	moves := func(what string, f func() error) {
		t.Helper()
		g0 := gen()
		if err := f(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if gen() == g0 {
			t.Errorf("%s did not move ServersGen", what)
		}
	}
	stays := func(what string, f func() error) {
		t.Helper()
		g0 := gen()
		if err := f(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if g := gen(); g != g0 {
			t.Errorf("%s moved ServersGen (%d -> %d)", what, g0, g)
		}
	}
	moves("CreateServer", func() error {
		_, err := st.CreateServer(state.Server{Name: "g1", BootMAC: "52:54:00:00:09:01", Lifecycle: state.LifecycleNew})
		return err
	})
	moves("Transition", func() error {
		_, err := st.Transition("g1", state.LifecycleNew, state.LifecycleCommissioning, "t")
		return err
	})
	moves("UpdateServer", func() error {
		_, err := st.UpdateServer("g1", func(s *state.Server) error { s.NeedsWipe = true; return nil })
		return err
	})
	moves("SetPower", func() error { _, err := st.SetPower("g1", state.PowerOn, state.PowerSourceCommand); return err })
	moves("a LastHeard flush", func() error { st.NoteHeard("g1", "test"); return st.FlushHeard() })
	stays("Server", func() error { _, err := st.Server("g1"); return err })
	stays("a token mint without Heard", func() error {
		_, _, err := st.IssueToken(state.TokenSpec{Purpose: state.PurposeReport, Server: "g1"})
		return err
	})
	stays("an event", func() error {
		_, err := st.AppendEvent(state.Event{Server: "g1", Kind: "test", Message: "m"})
		return err
	})
}
