// Package plantest holds the fixtures of the plan's tests, shared by the
// executor's (reconciler) tests and the status tests in gitops: the
// example site's inventory, a snapshot observing every desired server at
// one lifecycle, hardware big enough for every example profile, a store
// and a test logger. It imports only inventory and state, so the plan's
// own tests can use it.
package plantest

import (
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/state"
)

// T0 is the fixtures' clock: every observed lifecycle started then.
var T0 = time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)

// Example loads inventory-example/ at the repository root.
func Example(t testing.TB) *inventory.Inventory {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	res, err := inventory.Load(os.DirFS(filepath.Join(filepath.Dir(file), "..", "..", "..", "inventory-example")), inventory.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	return res.Inventory
}

// Observe builds a snapshot with every desired server at lifecycle lc
// (retired ones retired unless lc is new), with hw's hardware when hw is
// not nil.
func Observe(inv *inventory.Inventory, lc state.Lifecycle, hw func(name string) *state.Hardware) state.Snapshot {
	snap := state.Snapshot{Servers: map[string]*state.Server{}}
	for _, s := range inv.Servers {
		o := state.Server{Name: s.Name, Zone: s.Zone, Site: s.Site, Rack: s.Rack, BootMAC: s.BootMAC, BootMode: string(s.BootMode), Lifecycle: lc, LifecycleAt: T0,
			BMC: state.BMCFacts{Driver: string(s.BMC.Driver), Address: s.BMC.Address, Credentials: s.BMC.Credentials}}
		if s.Want == inventory.WantRetired && lc != state.LifecycleNew {
			o.Lifecycle = state.LifecycleRetired
		}
		if hw != nil {
			o.Hardware = hw(s.Name)
		}
		snap.Servers[s.Name] = &o
	}
	return snap
}

// HW is hardware with cores, memGiB of memory and one disk per size in GiB.
func HW(cores int, memGiB int64, disksGiB ...int64) *state.Hardware {
	h := &state.Hardware{Cores: cores, MemoryBytes: memGiB << 30}
	for i, d := range disksGiB {
		h.Disks = append(h.Disks, state.Disk{Name: "d" + string(rune('a'+i)), SizeBytes: d << 30})
	}
	return h
}

// BigHW gives every server enough for every example profile, larger by
// name so allocation order is visible, and one onboard NIC (the example
// storage profile's network layout takes the first NIC named e*).
func BigHW(name string) *state.Hardware {
	extra := int(name[len(name)-1] - '0')
	h := HW(16+extra, 256, 500)
	h.NICs = []state.NIC{{Name: "eno1", MAC: "3c:ec:ef:00:00:0" + name[len(name)-1:], Driver: "igb", PCIAddress: "0000:02:00.0", SpeedMbps: 1000, Link: true}}
	return h
}

// CloneInv copies inv's server, profile and image lists, so a test can
// change them without touching inv.
func CloneInv(inv *inventory.Inventory) *inventory.Inventory {
	c := *inv
	c.Servers = append([]inventory.Server(nil), inv.Servers...)
	c.Profiles = append([]inventory.Profile(nil), inv.Profiles...)
	c.Images = append([]inventory.Image(nil), inv.Images...)
	return &c
}

// Store opens a state store in t's temporary folder; at cleanup it checks
// the store's consistency (Store.Check) and closes it.
func Store(t *testing.T) *state.Store {
	t.Helper()
	st, err := state.Open(filepath.Join(t.TempDir(), "state.db"), state.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := st.Check(); err != nil {
			t.Error(err)
		}
		st.Close()
	})
	return st
}

// Logger logs at Debug to t's output, so the logs sit with the failing test.
func Logger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}
