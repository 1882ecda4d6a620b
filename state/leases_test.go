package state_test

import (
	"errors"
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	"github.com/machina-metal/machina/state"
)

// TestLeasesPersist: a lease survives reopening the state file (a
// controller restart) and LeasedIP answers from it until it expires; a
// renewal loop commits at most once per quarter lease; another MAC taking
// the address drops the old binding; a release deletes it.
func TestLeasesPersist(t *testing.T) {
	c := newClock()
	path := filepath.Join(t.TempDir(), "state.db")
	s, err := state.Open(path, state.Options{Now: c.Now})
	if err != nil {
		t.Fatal(err)
	}
	ip := netip.MustParseAddr("10.0.0.20")
	if err := s.PutLease(state.Lease{MAC: "52-54-00-00-00-20", IP: ip, Expires: c.Now().Add(time.Hour), Hostname: "r1-n20"}); err != nil {
		t.Fatal(err)
	}
	if err := s.PutLease(state.Lease{MAC: "not-a-mac", IP: ip, Expires: c.Now().Add(time.Hour)}); !errors.Is(err, state.ErrInvalid) {
		t.Errorf("PutLease(bad MAC) = %v, want ErrInvalid", err)
	}
	// A client renewing in a loop: nothing committed until a quarter of
	// the lease has passed.
	w0 := s.Writes()
	for range 100 {
		if err := s.PutLease(state.Lease{MAC: "52:54:00:00:00:20", IP: ip, Expires: c.Now().Add(time.Hour)}); err != nil {
			t.Fatal(err)
		}
	}
	if n := s.Writes() - w0; n != 0 {
		t.Errorf("100 immediate renewals made %d page writes, want 0", n)
	}
	c.Advance(30 * time.Minute) // T1: written
	if err := s.PutLease(state.Lease{MAC: "52:54:00:00:00:20", IP: ip, Expires: c.Now().Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	if s.Writes() == w0 {
		t.Error("the renewal at T1 was not written")
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s = openAt(t, path, state.Options{Now: c.Now}) // the controller restarted
	got, ok := s.LeasedIP("52:54:00:00:00:20")
	if !ok || got != ip {
		t.Fatalf("after reopening: LeasedIP = %v %v, want %v", got, ok, ip)
	}
	ls, err := s.Leases()
	if err != nil || len(ls) != 1 || ls[0].Hostname != "r1-n20" || !ls[0].Expires.Equal(c.Now().Add(time.Hour)) {
		t.Fatalf("Leases = %+v, %v", ls, err)
	}
	c.Advance(61 * time.Minute)
	if _, ok := s.LeasedIP("52:54:00:00:00:20"); ok {
		t.Error("an expired lease still binds its MAC")
	}
	// The address handed to another MAC: the old binding goes.
	if err := s.PutLease(state.Lease{MAC: "52:54:00:00:00:21", IP: ip, Expires: c.Now().Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	if ls, _ := s.Leases(); len(ls) != 1 || ls[0].MAC != "52:54:00:00:00:21" {
		t.Errorf("after the address moved: %+v, want only the new MAC", ls)
	}
	if err := s.DeleteLease("52:54:00:00:00:21"); err != nil {
		t.Fatal(err)
	}
	if _, ok := s.LeasedIP("52:54:00:00:00:21"); ok {
		t.Error("a released lease still binds its MAC")
	}
}
