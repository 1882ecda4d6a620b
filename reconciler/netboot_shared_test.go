package reconciler

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"github.com/machina-metal/machina/bmc/bmcsim"
	"github.com/machina-metal/machina/bmc/redfish"
	"github.com/machina-metal/machina/state"
)

// TestNetbootSharesReads: bmcMachine.Netboot over a real Redfish driver
// against bmcsim (Dell's iDRAC 9 tree, the machine off and on) runs as
// one bmc.ShareReads operation: the System is read once before the boot
// override PATCH and once after it (the read-back), and not again before
// the reset: the power read and the power action's first read take that
// read-back (without the scope they were two more GETs). The machine ends
// on, with the override read back as set.
func TestNetbootSharesReads(t *testing.T) {
	const sys = "/redfish/v1/Systems/System.Embedded.1"
	for _, on := range []bool{false, true} {
		t.Run(map[bool]string{false: "off", true: "on"}[on], func(t *testing.T) {
			dir, err := bmcsim.TreeDir("", "dell-poweredge-r750-idrac9")
			if err != nil {
				t.Fatal(err)
			}
			var trees bmcsim.Trees
			tr, err := trees.Load(dir)
			if err != nil {
				t.Fatal(err)
			}
			pw := bmcsim.NewMemoryPower(on)
			sim, err := bmcsim.New(bmcsim.Config{Tree: tr, Username: "admin", Password: "pw", Power: pw})
			if err != nil {
				t.Fatal(err)
			}
			ts := httptest.NewServer(sim)
			t.Cleanup(ts.Close)
			log := slog.New(slog.NewTextHandler(t.Output(), nil))
			drv, err := redfish.New(redfish.Config{Endpoint: ts.URL, Username: "admin", Password: "pw", PollInterval: time.Millisecond,
				Timeout: 2 * time.Second, ResetEvidenceTimeout: 2 * time.Second, Logger: log})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = drv.Close(context.Background()) })
			if _, err := drv.PowerState(context.Background()); err != nil { // selects the System
				t.Fatal(err)
			}
			st, err := state.Open(filepath.Join(t.TempDir(), "state.db"), state.Options{NoSync: true})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = st.Close() })
			sim.ClearRequests()
			m := &bmcMachine{st: st, drv: drv, obs: state.Server{Name: "s1"}, log: log, now: time.Now}
			if err := m.Netboot(context.Background()); err != nil {
				t.Fatal(err)
			}
			var seq []string
			for _, r := range sim.Requests() {
				switch {
				case r.Method == http.MethodGet && r.Path == sys:
					seq = append(seq, "GET System")
				case r.Method != http.MethodGet:
					seq = append(seq, r.Method+" "+r.Path)
				}
			}
			want := []string{"GET System", "PATCH " + sys, "GET System", "POST " + sys + "/Actions/ComputerSystem.Reset"}
			if len(seq) < len(want)+1 || seq[len(want)] != "GET System" {
				t.Fatalf("System reads and writes = %v, want %v then power polls", seq, want)
			}
			for i, w := range want {
				if seq[i] != w {
					t.Fatalf("System reads and writes = %v, want %v then power polls", seq, want)
				}
			}
			if !pw.On() {
				t.Error("machine not on after the netboot")
			}
		})
	}
}
