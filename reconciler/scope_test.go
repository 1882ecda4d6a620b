package reconciler

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/machina-metal/machina/reconciler/plan"
)

// TestControllerScopeClaims: with a Scope, a pass reads the claims first:
// the scope's conditions are in the pass's result, and a claims read
// error skips the pass (nothing planned) instead of planning blind.
func TestControllerScopeClaims(t *testing.T) {
	st := openEnrolStore(t)
	inv := exampleInventory(t)
	claimsErr := error(nil)
	c, err := New(Config{Store: st, Drivers: &countingDrivers{d: &recordingDriver{}}, Logger: testLogger(t), Now: func() time.Time { return planT0 },
		Scope: &plan.Scope{Group: "east", Zones: []string{"zone-a", "zone-b"}},
		Claims: func() (map[string][]string, error) {
			return map[string][]string{"west": {"zone-b"}}, claimsErr
		}})
	if err != nil {
		t.Fatal(err)
	}
	c.SetDesired(inv)
	res := c.Pass(context.Background())
	c.wg.Wait()
	var regs, conflicts int
	for _, s := range res.Steps {
		if s.Action == plan.ActRegister {
			regs++
			if !strings.HasPrefix(s.Server, "r1-") {
				t.Errorf("registers %s outside the uncontested zone-a", s.Server)
			}
		}
	}
	for _, cd := range res.Conditions {
		if cd.Type == plan.CondZoneClaimConflict {
			conflicts++
		}
	}
	if regs != 5 || conflicts != 5 {
		t.Fatalf("%d registers, %d conflicts; want 5 and 5 (4 zone-b servers and the storage profile)", regs, conflicts)
	}
	claimsErr = errors.New("etcd unreachable")
	if res := c.Pass(context.Background()); len(res.Steps)+len(res.Conditions) != 0 {
		t.Fatalf("pass without claims planned %+v", res)
	}
	if _, err := New(Config{Store: st, Drivers: &countingDrivers{}, Scope: &plan.Scope{Group: "g"}}); err == nil {
		t.Fatal("Scope without Claims accepted")
	}
}

// TestProvisionScoped: a group's POST /api/v1/provision allocates only in
// its own zones: another zone's profile, or a contested one, is refused.
func TestProvisionScoped(t *testing.T) {
	st := openEnrolStore(t)
	inv := exampleInventory(t)
	c, err := New(Config{Store: st, Drivers: &countingDrivers{d: &recordingDriver{}}, Logger: testLogger(t),
		Scope:  &plan.Scope{Group: "east", Zones: []string{"zone-a", "zone-b"}},
		Claims: func() (map[string][]string, error) { return map[string][]string{"west": {"zone-b"}}, nil }})
	if err != nil {
		t.Fatal(err)
	}
	c.SetDesired(inv)
	for _, prof := range []string{"gpu", "storage"} { // zone-c: not east's; zone-b: contested
		if _, err := c.Provision(prof, 1, "test"); err == nil || !strings.Contains(err.Error(), "controller group east") {
			t.Errorf("Provision(%s) = %v, want refused for group east", prof, err)
		}
	}
	if _, err := c.Provision("hypervisor", 1, "test"); !errors.Is(err, ErrNoCapacity) { // east's profile: no ready server in the empty store
		t.Errorf("Provision(hypervisor) = %v, want ErrNoCapacity", err)
	}
}
