package controller

import (
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/machina-metal/machina/bmc"
	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/reconciler"
	"github.com/machina-metal/machina/state"
)

// TestGroupScopesHostWatchAndClaims: a group's host watch marks lost only
// the hosts whose server is in its zones (by servers.yaml first, else the
// record), and its claims reader records the group's claim again after it
// was deleted; without a group every host is watched.
func TestGroupScopesHostWatchAndClaims(t *testing.T) {
	st, err := state.Open(filepath.Join(t.TempDir(), "state.db"), state.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for i, s := range []struct{ name, zone string }{{"a1", "zone-a"}, {"b1", "zone-b"}, {"moved", "zone-b"}} {
		if _, err := st.CreateServer(state.Server{Name: s.name, Zone: s.zone, BootMAC: "52:54:00:00:00:0" + string(rune('1'+i))}); err != nil {
			t.Fatal(err)
		}
		if _, err := st.PutHost(state.Host{Name: s.name, Server: s.name, CertFingerprint: "ab", JoinStatus: "joined", LastSeen: time.Now().Add(-time.Hour)}); err != nil {
			t.Fatal(err)
		}
	}
	ctrl, err := reconciler.New(reconciler.Config{Store: st, Drivers: powerDrivers{p: bmc.PowerOn}})
	if err != nil {
		t.Fatal(err)
	}
	// servers.yaml moved "moved" into zone-a; its record still says zone-b.
	ctrl.SetDesired(&inventory.Inventory{Servers: []inventory.Server{{Name: "a1", Zone: "zone-a"}, {Name: "b1", Zone: "zone-b"}, {Name: "moved", Zone: "zone-a"}}})
	w := &wiring{cfg: Config{Group: "east", Zones: []string{"zone-a"}}, st: st, ctrl: ctrl, log: slog.New(slog.DiscardHandler)}
	hw := newHostWatch(st, powerDrivers{p: bmc.PowerOn}, &fencer{}, ctrl.Desired, hostWatchConfig{heartbeat: time.Second}, w.log).scopedTo(w.hostInScope())
	hw.check(t.Context())
	for name, lost := range map[string]bool{"a1": true, "moved": true, "b1": false} {
		h, err := st.Host(name)
		if err != nil {
			t.Fatal(err)
		}
		if (h.Lost != nil) != lost {
			t.Errorf("host %s lost = %v, want %v", name, h.Lost != nil, lost)
		}
	}
	if (&wiring{}).hostInScope() != nil {
		t.Error("an ungrouped controller's host watch is scoped")
	}

	m, err := w.zoneClaims()
	if err != nil || len(m["east"]) != 1 || m["east"][0] != "zone-a" {
		t.Fatalf("claims = %v, %v", m, err)
	}
	if err := st.DeleteZoneClaim("east"); err != nil {
		t.Fatal(err)
	}
	if m, err := w.zoneClaims(); err != nil || len(m["east"]) != 1 {
		t.Fatalf("claims after an operator deleted east's = %v, %v; want it recorded again", m, err)
	}
}
