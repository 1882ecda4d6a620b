package reconciler

import (
	"context"
	"errors"
	"testing"

	"github.com/machina-metal/machina/bmc"
	"github.com/machina-metal/machina/state"
)

// onceOnlyDriver offers only one-time boot overrides (Lenovo XCC lists
// Once and Disabled) and reads back what was set last.
type onceOnlyDriver struct {
	recordingDriver
	set []bmc.BootOverride
}

func (d *onceOnlyDriver) SetBootOverride(_ context.Context, o bmc.BootOverride) error {
	if o.Persistent {
		return bmc.ErrUnsupported
	}
	d.set = append(d.set, o)
	return nil
}

func (d *onceOnlyDriver) BootOverride(context.Context) (bmc.BootOverride, error) {
	if len(d.set) == 0 {
		return bmc.BootOverride{}, nil
	}
	return d.set[len(d.set)-1], nil
}

// TestMachineFallbackRules: the rules behind Machine, against drivers
// that refuse: BootDisk asks persistent, else once, and reads it back;
// Netboot on a BMC learned not to honour Once asks Continuous, else Once,
// and marks the record to set disk back after the boot.
func TestMachineFallbackRules(t *testing.T) {
	st := openEnrolStore(t)
	serverAt(t, st, "s1", state.LifecycleReady, func(s *state.Server) { s.BMC.OnceNotHonoured = true })
	obs, _ := st.Server("s1")
	c, err := New(Config{Store: st, Drivers: driverFunc(nil), Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	d := &onceOnlyDriver{}
	m := c.machine(d, obs, bmc.BootModeUEFI, false, testLogger(t))
	if err := m.BootDisk(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(d.set) != 1 || d.set[0].Device != bmc.BootDisk || d.set[0].Persistent {
		t.Errorf("BootDisk set %+v, want disk once after the persistent refusal", d.set)
	}
	if err := m.Netboot(context.Background()); err != nil {
		t.Fatal(err)
	}
	if last := d.set[len(d.set)-1]; last.Device != bmc.BootPXE || last.Persistent {
		t.Errorf("Netboot set %+v, want PXE once after the persistent refusal", last)
	}
	if s, _ := st.Server("s1"); s.BMC.RestoreDisk {
		t.Error("a one-time override marked the record to restore disk")
	}
	// A read back that is not disk is a mismatch, not success.
	d.set = nil
	bad := &mismatchDriver{}
	if err := c.machine(bad, obs, bmc.BootModeUEFI, false, testLogger(t)).BootDisk(context.Background()); !errors.Is(err, bmc.ErrMismatch) {
		t.Errorf("BootDisk with a PXE read back = %v, want ErrMismatch", err)
	}
}

// mismatchDriver accepts every override and reads back PXE.
type mismatchDriver struct{ recordingDriver }

func (*mismatchDriver) BootOverride(context.Context) (bmc.BootOverride, error) {
	return bmc.BootOverride{Device: bmc.BootPXE}, nil
}
