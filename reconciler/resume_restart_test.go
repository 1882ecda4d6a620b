package reconciler

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/machina-metal/machina/bmc"
	"github.com/machina-metal/machina/bmc/bmcsim"
	"github.com/machina-metal/machina/bmc/redfish"
	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/reconciler/plan"
	"github.com/machina-metal/machina/state"
)

// simDrivers opens a real Redfish driver on one bmcsim for every server.
// TaskTimeout is short: the executor lets a BMC action run on for
// Config.ShutdownGrace when the controller stops (its context is not the
// pass's), so the first controller's held task or request must give up
// for the test to go on.
type simDrivers struct {
	url string
	log *slog.Logger
}

func (d simDrivers) Driver(context.Context, state.Server) (bmc.Driver, error) {
	return redfish.New(redfish.Config{Endpoint: d.url, Username: "admin", Password: "pw", PollInterval: 20 * time.Millisecond,
		Timeout: 2 * time.Second, ResetEvidenceTimeout: 2 * time.Second, TaskTimeout: time.Second, Logger: d.log})
}

// resetsPerformed counts the ComputerSystem.Reset requests the BMC
// performed (a 2xx answer; a request the client gave up on is recorded
// with status 0 and was not performed).
func resetsPerformed(sim *bmcsim.Server) int {
	n := 0
	for _, q := range sim.Requests() {
		if q.Method == http.MethodPost && strings.HasSuffix(q.Path, "ComputerSystem.Reset") && q.Status >= 200 && q.Status < 300 {
			n++
		}
	}
	return n
}

// TestResumedPowerCycleReadsBackFirst restarts the reconciler in the middle
// of a journalled power cycle (servers.yaml actions.powerCycle) against
// bmcsim over a real Redfish driver and a bbolt state file: the first
// controller's store is closed (nothing it does after that reaches the
// state, as after a SIGKILL or a lost leadership) while its reset is at
// the BMC, and a second controller opens the same file and resumes the
// entry. It reads the BMC back first:
//   - the reset reached the BMC (performed, its task still running):
//     LastResetTime moved past the mark written ahead, so nothing is sent
//     again: one reset in all;
//   - the reset never got there (held, and dropped when the client went
//     away): LastResetTime unchanged, so it is sent again: one reset;
//   - a BMC with no LastResetTime (HPE iLO 5, Lenovo XCC) that reads on:
//     not repeated, recorded as unverified.
//
// Without Restart (powerStep calling Power) the first case resets twice
// (checked).
func TestResumedPowerCycleReadsBackFirst(t *testing.T) {
	for _, c := range []struct {
		name       string
		tree       string
		noLRT      bool
		fault      bmcsim.Fault
		wantResets int
		unverified bool
	}{
		{name: "reset reached the BMC", tree: "openbmc-bmcweb-stock",
			fault: bmcsim.Fault{Method: http.MethodPost, PathSuffix: "/Actions/ComputerSystem.Reset", Kind: bmcsim.FaultAccepted, TaskPolls: 1 << 20, Times: 1}, wantResets: 1},
		{name: "reset never reached the BMC", tree: "dell-poweredge-r750-idrac9",
			fault: bmcsim.Fault{Method: http.MethodPost, PathSuffix: "/Actions/ComputerSystem.Reset", Kind: bmcsim.FaultSlow, Delay: time.Hour, Times: 1}, wantResets: 1},
		{name: "no LastResetTime, reads on", tree: "openbmc-bmcweb-stock", noLRT: true,
			fault: bmcsim.Fault{Method: http.MethodPost, PathSuffix: "/Actions/ComputerSystem.Reset", Kind: bmcsim.FaultAccepted, TaskPolls: 1 << 20, Times: 1}, wantResets: 1, unverified: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			log := slog.New(slog.NewTextHandler(t.Output(), nil))
			dir, err := bmcsim.TreeDir("", c.tree)
			if err != nil {
				t.Fatal(err)
			}
			tr, err := bmcsim.LoadTree(dir)
			if err != nil {
				t.Fatal(err)
			}
			cfg := bmcsim.Config{Tree: tr, Username: "admin", Password: "pw", Power: bmcsim.NewMemoryPower(true)}
			if c.noLRT {
				cfg.Quirks = &bmcsim.Quirks{NoLastResetTime: true} // as HPE iLO 5 and Lenovo XCC
			}
			sim, err := bmcsim.New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			ts := httptest.NewServer(sim)
			defer ts.Close()

			path := filepath.Join(t.TempDir(), "state.db")
			st, err := state.Open(path, state.Options{})
			if err != nil {
				t.Fatal(err)
			}
			const name = "s1"
			inv := &inventory.Inventory{
				Servers: []inventory.Server{{Name: name, Zone: "z", BootMAC: "52:54:00:00:00:01", BootMode: inventory.BootUEFI, Want: inventory.WantReady,
					BMC:     inventory.BMC{Driver: inventory.DriverRedfish, Address: ts.URL, Credentials: "c"},
					Actions: inventory.Actions{PowerCycle: 1}}},
				Digest: "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
			}
			ws := inv.Servers[0]
			if _, err := st.CreateServer(plan.Record(&ws)); err != nil {
				t.Fatal(err)
			}
			for _, mv := range []state.Move{{Server: name, From: state.LifecycleNew, To: state.LifecycleCommissioning}, {Server: name, From: state.LifecycleCommissioning, To: state.LifecycleReady}} {
				if _, err := st.Apply(mv); err != nil {
					t.Fatal(err)
				}
			}
			sim.Inject(c.fault)
			drivers := simDrivers{url: ts.URL, log: log}

			// The first controller: its power cycle goes out and it dies
			// while the request is at the BMC.
			ctx1, cancel1 := context.WithCancel(context.Background())
			defer cancel1()
			ctl1, err := New(Config{Store: st, Drivers: drivers, Logger: log.With("controller", 1)})
			if err != nil {
				t.Fatal(err)
			}
			ctl1.SetDesired(inv)
			ctl1.Pass(ctx1)
			// Written ahead, then at the BMC (a held request is recorded
			// only when it ends).
			for deadline := time.Now().Add(20 * time.Second); ; {
				if sawReset(sim) {
					break
				}
				if s, err := st.Server(name); c.fault.Kind == bmcsim.FaultSlow && err == nil && s.InFlight != nil && !s.InFlight.PowerSent.IsZero() {
					time.Sleep(100 * time.Millisecond) // on its way to the BMC, where it is held
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("the first controller sent no reset within 20 s")
				}
				time.Sleep(10 * time.Millisecond)
			}
			if err := st.Close(); err != nil {
				t.Fatal(err)
			}
			cancel1()
			ctl1.wg.Wait()
			sim.ClearFaults()
			performed := resetsPerformed(sim)

			// The second controller resumes the journal entry.
			st2, err := state.Open(path, state.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer st2.Close()
			srv, err := st2.Server(name)
			if err != nil {
				t.Fatal(err)
			}
			if srv.InFlight == nil {
				t.Fatal("the first controller left no journalled power cycle")
			}
			if srv.InFlight.PowerSent.IsZero() {
				t.Errorf("the journalled power cycle has no PowerSent written ahead: %+v", srv.InFlight)
			}
			if c.noLRT != srv.InFlight.ResetMark.IsZero() {
				t.Errorf("ResetMark %v written ahead on a BMC with LastResetTime %v", srv.InFlight.ResetMark, !c.noLRT)
			}
			ctl2, err := New(Config{Store: st2, Drivers: drivers, Logger: log.With("controller", 2)})
			if err != nil {
				t.Fatal(err)
			}
			ctl2.SetDesired(inv)
			ctl2.Pass(context.Background())
			ctl2.wg.Wait()

			if got := resetsPerformed(sim); got != c.wantResets {
				t.Errorf("the BMC performed %d resets (%d before the restart), want %d", got, performed, c.wantResets)
			}
			srv, err = st2.Server(name)
			if err != nil {
				t.Fatal(err)
			}
			if srv.InFlight != nil || srv.Actions["powerCycle"] != 1 {
				t.Errorf("after the resume: in flight %+v, actions %v; want the entry done and powerCycle 1 observed", srv.InFlight, srv.Actions)
			}
			if got := srv.BMC.ResetUnverified != ""; got != c.unverified {
				t.Errorf("ResetUnverified %q, want set %v", srv.BMC.ResetUnverified, c.unverified)
			}
		})
	}
}

// sawReset reports whether sim received a ComputerSystem.Reset request
// (performed or held).
func sawReset(sim *bmcsim.Server) bool {
	for _, q := range sim.Requests() {
		if q.Method == http.MethodPost && strings.HasSuffix(q.Path, "ComputerSystem.Reset") {
			return true
		}
	}
	return false
}
