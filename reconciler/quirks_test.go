package reconciler

import (
	"context"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/machina-metal/machina/bmc"
	"github.com/machina-metal/machina/bmc/ipmi"
	"github.com/machina-metal/machina/internal/pyghmibmc"
	"github.com/machina-metal/machina/state"
)

// TestQuirksLearnedAgainstPyghmi runs the IPMI driver against pyghmi's Bmc
// class behaving as VirtualBMC over libvirt (keeps only the boot device,
// applies it at the next power-on): finish-deploy's BootDisk on a running
// machine learns the three quirks (one event, once), powers off, reads
// disk back and powers on, so the machine boots its disk, and succeeds
// rather than failing on the read-back. A netboot afterwards treats the
// one-time PXE override as unverifiable (disk is set back after the boot)
// and powers off then on instead of resetting. A server that is not
// deployed is left off.
func TestQuirksLearnedAgainstPyghmi(t *testing.T) {
	b := pyghmibmc.Start(t, pyghmibmc.Config{ApplyAtPowerOn: true})
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	drv, err := ipmi.New(ipmi.Config{Address: b.Addr(), Username: "admin", Password: "password",
		PowerTimeout: 5 * time.Second, PollInterval: 50 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = drv.Close(context.Background()) })
	// The ramdisk wrote the image: the machine runs, booted from PXE.
	if err := drv.SetBootOverride(ctx, bmc.BootOverride{Device: bmc.BootPXE, Mode: bmc.BootModeLegacy}); err != nil {
		t.Fatal(err)
	}
	if err := drv.Power(ctx, bmc.PowerActionOn); err != nil {
		t.Fatal(err)
	}
	st := openEnrolStore(t)
	serverAt(t, st, "s1", state.LifecycleDeployed, nil)
	c, err := New(Config{Store: st, Drivers: driverFunc(nil), Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	machine := func() Machine {
		obs, err := st.Server("s1")
		if err != nil {
			t.Fatal(err)
		}
		return c.machine(drv, obs, bmc.BootModeUEFI, false, testLogger(t))
	}
	for range 2 { // the second pass learns nothing new
		if err := machine().BootDisk(ctx); err != nil {
			t.Fatalf("BootDisk: %v", err)
		}
	}
	s, _ := st.Server("s1")
	if want := []string{"bootDeviceAtPowerOn", "bootFlagsNotPersistent", "bootModeIgnored"}; !slices.Equal(s.BMC.Quirks, want) {
		t.Errorf("quirks %q, want %q", s.BMC.Quirks, want)
	}
	if n := countEvents(t, st, "bmc.quirk_learned"); n != 1 {
		t.Errorf("%d bmc.quirk_learned events, want 1", n)
	}
	boots, _ := b.Boots()
	if want := []string{"power-on network", "power-on hd"}; !slices.Equal(boots, want) {
		t.Fatalf("boots %q, want %q: the machine must boot its disk", boots, want)
	}
	if err := machine().Netboot(ctx); err != nil {
		t.Fatalf("Netboot: %v", err)
	}
	boots, _ = b.Boots()
	if last := boots[len(boots)-1]; last != "power-on network" {
		t.Errorf("netboot's boot %q, want a power-on from the network (a reset would boot the running device)", last)
	}
	if s, _ := st.Server("s1"); !s.BMC.RestoreDisk {
		t.Error("RestoreDisk not set: a one-time override on a BMC that drops the persistent flag must not count as honoured")
	}

	// restore-disk on a server that is not deployed (its agent powers it
	// off after a commissioning report): off and read back, not on again.
	serverAt(t, st, "s2", state.LifecycleReady, nil)
	obs, _ := st.Server("s2")
	if err := c.machine(drv, obs, bmc.BootModeUEFI, false, testLogger(t)).BootDisk(ctx); err != nil {
		t.Fatalf("BootDisk of a ready server: %v", err)
	}
	if ps, err := drv.PowerState(ctx); err != nil || ps != bmc.PowerOff {
		t.Errorf("ready server after BootDisk: %v, %v; want off", ps, err)
	}
	if got, _ := b.Boots(); len(got) != len(boots) {
		t.Errorf("boots %q after a ready server's BootDisk, want no new boot after %q", got, boots)
	}
}

func countEvents(t *testing.T, st *state.Store, kind string) int {
	t.Helper()
	evs, err := st.Events(state.EventQuery{Server: "s1", Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range evs {
		if string(e.Kind) == kind {
			n++
		}
	}
	return n
}
