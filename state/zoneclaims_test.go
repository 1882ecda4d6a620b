package state_test

import (
	"errors"
	"slices"
	"testing"

	"github.com/machina-metal/machina/state"
)

// TestZoneClaims: a group's claim is stored sorted and deduplicated,
// replaced by the next, listed by group, refused for a bad name, deleted;
// a change writes one event, an unchanged claim none.
func TestZoneClaims(t *testing.T) {
	eachEngine(t, func(t *testing.T) {
		s := openTest(t, state.Options{})
		if err := s.PutZoneClaim("east", []string{"z2", "z1", "z2"}, "ctl-a"); err != nil {
			t.Fatal(err)
		}
		if err := s.PutZoneClaim("west", []string{"z3"}, "ctl-b"); err != nil {
			t.Fatal(err)
		}
		if err := s.PutZoneClaim("east", []string{"z1", "z2"}, "ctl-a"); err != nil { // unchanged: no event
			t.Fatal(err)
		}
		m, err := s.ZoneClaimMap()
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(m["east"], []string{"z1", "z2"}) || !slices.Equal(m["west"], []string{"z3"}) || len(m) != 2 {
			t.Fatalf("claims = %v", m)
		}
		var n int
		for _, e := range allEvents(t, s, state.EventQuery{}) {
			if e.Kind == state.EventZoneClaim {
				n++
			}
		}
		if n != 2 {
			t.Fatalf("%d zone claim events, want 2", n)
		}
		for _, bad := range [][2]string{{"East", "z1"}, {"east", "Z_1"}, {"east", ""}} {
			zones := []string{bad[1]}
			if bad[1] == "" {
				zones = nil
			}
			if err := s.PutZoneClaim(bad[0], zones, "x"); !errors.Is(err, state.ErrInvalid) {
				t.Errorf("PutZoneClaim(%q, %q) = %v, want ErrInvalid", bad[0], zones, err)
			}
		}
		if err := s.DeleteZoneClaim("west"); err != nil {
			t.Fatal(err)
		}
		cs, err := s.ZoneClaims()
		if err != nil || len(cs) != 1 || cs[0].Group != "east" || cs[0].By != "ctl-a" {
			t.Fatalf("after delete: %+v, %v", cs, err)
		}
	})
}
