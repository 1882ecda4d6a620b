package sim_test

import (
	"strings"
	"testing"
	"time"

	"github.com/machina-metal/machina/bmc/ipmi/ipmisim/ipmisimtest"
	"github.com/machina-metal/machina/controller"
	"github.com/machina-metal/machina/state"
)

// TestBMCSweep: with the controller's BMC sweep on (1 s), every server's
// health in the store becomes what its BMC reports (the vendor trees'
// System Status.HealthRollup or Health, which differ: OK, Warning,
// Critical; ipmi_sim's sensors for the IPMI servers) and its power is read
// from the BMC. Then a power supply fails on one Redfish BMC (its System's
// health turns Critical) and someone powers a ready server on outside
// Machina (the power button): both show in the store with a health and a
// power event, with no operator action.
func TestBMCSweep(t *testing.T) {
	ipmisimtest.RequireTools(t)
	r := startRig(t, rigOptions{ipmi: true, config: func(c *controller.Config) { c.BMCWatchInterval = time.Second }})
	snap := r.steady()

	// What each Redfish BMC reports; the IPMI ones have no lab.BMC.
	want := map[string]string{}
	ipmi := 0
	for name := range snap.Servers {
		b := r.lab.BMC(name)
		if b == nil {
			ipmi++
			continue
		}
		want[name] = systemHealth(t, r, name)
	}
	if len(want) == 0 || ipmi == 0 {
		t.Fatalf("%d Redfish and %d IPMI servers; the test needs both", len(want), ipmi)
	}
	kinds := map[string]bool{}
	for _, h := range want {
		kinds[h] = true
	}
	if len(kinds) < 2 {
		t.Fatalf("every Redfish BMC reports health %v: the check would not tell trees apart", want)
	}
	snap = r.waitFor("health from every BMC", time.Minute, func(s state.Snapshot) bool {
		for name, srv := range s.Servers {
			if h, ok := want[name]; ok && srv.Health != h {
				return false
			}
			if _, ok := want[name]; !ok && srv.Health == "" { // IPMI: ipmi_sim's sensors
				return false
			}
		}
		return true
	})
	for name, srv := range snap.Servers {
		t.Logf("%s: health %q, power %s (%s)", name, srv.Health, srv.Power.State, srv.Power.Source)
	}

	// A power supply fails: the BMC's rollup turns Critical.
	var victim string
	for name, h := range want {
		if h == "OK" && record(snap, name).Lifecycle == state.LifecycleReady {
			victim = name
			break
		}
	}
	if victim == "" {
		t.Fatalf("no ready Redfish server whose BMC says OK: %v", want)
	}
	sys := systemPath(t, r, victim)
	if !r.lab.BMC(victim).Patch(sys, func(b map[string]any) {
		st, _ := b["Status"].(map[string]any)
		if st == nil {
			st = map[string]any{}
			b["Status"] = st
		}
		st["Health"], st["HealthRollup"] = "Critical", "Critical"
	}) {
		t.Fatalf("%s: no System at %s", victim, sys)
	}
	// Someone presses the power button of the same (ready, off) server.
	if srv := record(snap, victim); srv.Power.State != state.PowerOff {
		t.Fatalf("%s is %s, want a ready server that is off", victim, srv.Power.State)
	}
	r.lab.Machine(victim).PowerOn()
	srv := r.waitServer(victim, "Critical and on, read from its BMC", time.Minute, func(s state.Server) bool {
		return s.Health == "Critical" && s.Power.State == state.PowerOn && s.Power.Source == state.PowerSourceBMC
	})
	if srv.Lifecycle != state.LifecycleReady {
		t.Errorf("%s is %s: the sweep must only observe", victim, srv.Lifecycle)
	}
	evs, err := r.run.Store.Events(state.EventQuery{Server: victim, Limit: state.MaxPageSize})
	if err != nil {
		t.Fatal(err)
	}
	var health, power bool
	for _, e := range evs {
		health = health || e.Kind == state.EventHealth && strings.HasSuffix(e.Message, "→Critical")
		power = power || e.Kind == state.EventPower && e.Message == "power powered_off→powered_on (bmc)"
	}
	if !health || !power {
		t.Errorf("%s events lack the health (%v) or power (%v) change", victim, health, power)
	}

	// A refused credential: the sweep's failure shows on every Redfish
	// server (BMCError, a BMCReachable=False condition in status), and is
	// cleared once the secret is right again.
	user, pass := r.lab.Credentials()
	if _, err := r.run.Store.PutSecret("bmc-redfish", state.Credential{Username: user, Password: "not-" + pass}, "test"); err != nil {
		t.Fatal(err)
	}
	srv = r.waitServer(victim, "BMC unreadable", time.Minute, func(s state.Server) bool { return strings.Contains(s.BMCError, "401") })
	if strings.Contains(srv.BMCError, pass) {
		t.Errorf("BMCError holds the password: %q", srv.BMCError)
	}
	if _, err := r.run.Store.PutSecret("bmc-redfish", state.Credential{Username: user, Password: pass}, "test"); err != nil {
		t.Fatal(err)
	}
	// A refused login skips that BMC for 3 sweeps (3 s here).
	r.waitServer(victim, "BMC read again", time.Minute, func(s state.Server) bool { return s.BMCError == "" })

	// A credential missing from the secret store is said the same way,
	// with what to do.
	if err := r.run.Store.DeleteSecret("bmc-redfish", "test"); err != nil {
		t.Fatal(err)
	}
	r.waitServer(victim, "BMC unreadable without its credential", time.Minute, func(s state.Server) bool {
		return strings.Contains(s.BMCError, "not in the secret store")
	})
	if _, err := r.run.Store.PutSecret("bmc-redfish", state.Credential{Username: user, Password: pass}, "test"); err != nil {
		t.Fatal(err)
	}
	r.waitServer(victim, "BMC read again", time.Minute, func(s state.Server) bool { return s.BMCError == "" })
}

// systemPath is the first member of the BMC's Systems collection.
func systemPath(t *testing.T, r *rig, name string) string {
	t.Helper()
	coll := r.lab.BMC(name).Get("/redfish/v1/Systems")
	ms, _ := coll["Members"].([]any)
	if len(ms) == 0 {
		t.Fatalf("%s: no Systems members", name)
	}
	m, _ := ms[0].(map[string]any)
	p, _ := m["@odata.id"].(string)
	return p
}

// systemHealth is the System's Status.HealthRollup, else Status.Health.
func systemHealth(t *testing.T, r *rig, name string) string {
	t.Helper()
	sys := r.lab.BMC(name).Get(systemPath(t, r, name))
	st, _ := sys["Status"].(map[string]any)
	if h, _ := st["HealthRollup"].(string); h != "" {
		return h
	}
	h, _ := st["Health"].(string)
	return h
}
