package redfish_test

import (
	"context"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/machina-metal/machina/bmc"
	"github.com/machina-metal/machina/bmc/bmcsim"
	"github.com/machina-metal/machina/bmc/redfish"
)

// benchDriver is a driver against a bmcsim BMC serving Dell's iDRAC 9
// tree (its System is the largest of the fixtures, about 15 KB), the
// machine off.
func benchDriver(b *testing.B) *redfish.Driver {
	b.Helper()
	dir, err := bmcsim.TreeDir("", treeDell)
	if err != nil {
		b.Fatal(err)
	}
	tr, err := trees.Load(dir)
	if err != nil {
		b.Fatal(err)
	}
	sim, err := bmcsim.New(bmcsim.Config{Tree: tr, Username: "admin", Password: "s3cret", Power: bmcsim.NewMemoryPower(false)})
	if err != nil {
		b.Fatal(err)
	}
	ts := httptest.NewServer(sim)
	b.Cleanup(ts.Close)
	drv, err := redfish.New(redfish.Config{Endpoint: ts.URL, Username: "admin", Password: "s3cret",
		PollInterval: time.Millisecond, RetryBase: time.Millisecond, PowerTimeout: 5 * time.Second,
		Timeout: 5 * time.Second, ResetEvidenceTimeout: time.Second})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = drv.Close(context.Background()) })
	if _, err := drv.PowerState(context.Background()); err != nil {
		b.Fatal(err)
	}
	return drv
}

// BenchmarkNetbootActions is the driver's part of one netboot as the
// reconciler runs it (a one-time PXE override set and read back, the power
// read, power on and its wait), then a power off to start the next round,
// against the simulated BMC on loopback (its CPU counted too).
func BenchmarkNetbootActions(b *testing.B) {
	drv := benchDriver(b)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if err := drv.SetBootOverride(ctx, bmc.BootOverride{Device: bmc.BootPXE}); err != nil {
			b.Fatal(err)
		}
		if _, err := drv.PowerState(ctx); err != nil {
			b.Fatal(err)
		}
		if err := drv.Power(ctx, bmc.PowerActionOn); err != nil {
			b.Fatal(err)
		}
		if err := drv.Power(ctx, bmc.PowerActionOff); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkPowerState is one PowerState read of an unchanged System.
func BenchmarkPowerState(b *testing.B) {
	drv := benchDriver(b)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := drv.PowerState(ctx); err != nil {
			b.Fatal(err)
		}
	}
}
