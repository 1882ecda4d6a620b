package redfish_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/machina-metal/machina/bmc"
	"github.com/machina-metal/machina/bmc/bmcsim"
	"github.com/machina-metal/machina/bmc/redfish"
)

// benchBMC is a bmcsim BMC serving Dell's iDRAC 9 tree (its System is
// the largest of the fixtures, about 15 KB) over loopback HTTP, with
// power pw; closed when b ends.
func benchBMC(b *testing.B, pw bmcsim.PowerBackend) (*bmcsim.Server, *httptest.Server) {
	b.Helper()
	dir, err := bmcsim.TreeDir("", treeDell)
	if err != nil {
		b.Fatal(err)
	}
	tr, err := trees.Load(dir)
	if err != nil {
		b.Fatal(err)
	}
	sim, err := bmcsim.New(bmcsim.Config{Tree: tr, Username: "admin", Password: "s3cret", Power: pw})
	if err != nil {
		b.Fatal(err)
	}
	ts := httptest.NewServer(sim)
	b.Cleanup(ts.Close)
	return sim, ts
}

// benchOpen is a driver of the benchmarks' BMC at url, polling every
// millisecond; the caller closes it.
func benchOpen(b *testing.B, url string) *redfish.Driver {
	b.Helper()
	drv, err := redfish.New(redfish.Config{Endpoint: url, Username: "admin", Password: "s3cret",
		PollInterval: time.Millisecond, RetryBase: time.Millisecond, PowerTimeout: 5 * time.Second,
		Timeout: 5 * time.Second, ResetEvidenceTimeout: time.Second})
	if err != nil {
		b.Fatal(err)
	}
	return drv
}

// benchDriver is a driver against benchBMC's BMC, the machine off, its
// System already selected.
func benchDriver(b *testing.B) *redfish.Driver {
	b.Helper()
	_, ts := benchBMC(b, bmcsim.NewMemoryPower(false))
	drv := benchOpen(b, ts.URL)
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

// BenchmarkNetboot is one netboot of a stopped machine as the reconciler
// runs it (reconciler.bmcMachine.Netboot, one bmc.ShareReads operation):
// a one-time PXE override set and read back, the power read that picks
// on or reset, power on and its wait, against bmcsim serving Dell's
// iDRAC 9 tree on loopback (the emulator's CPU counted too). "cached"
// reuses one driver (its session and System selection); "fresh" opens a
// new driver per netboot, as a controller of 10,000 servers mostly does
// (its driver cache holds 256), so the login and the System selection
// are in it. Between netboots, with the timer stopped, the machine is
// switched off in the emulator directly. Besides time and allocations it
// reports the requests the BMC answered per netboot (req/netboot) and how
// many of them were GETs of the ComputerSystem (sysGET/netboot).
func BenchmarkNetboot(b *testing.B) {
	for _, fresh := range []bool{false, true} {
		name := "cached"
		if fresh {
			name = "fresh"
		}
		b.Run(name, func(b *testing.B) {
			pw := bmcsim.NewMemoryPower(false)
			sim, ts := benchBMC(b, pw)
			open := func() *redfish.Driver { return benchOpen(b, ts.URL) }
			bg := context.Background()
			drv := open()
			if _, err := drv.PowerState(bg); err != nil {
				b.Fatal(err)
			}
			sim.ClearRequests()
			var reqs, sysGets int
			b.ReportAllocs()
			for b.Loop() {
				if fresh {
					b.StopTimer()
					_ = drv.Close(bg)
					drv = open()
					sim.ClearRequests()
					b.StartTimer()
				}
				ctx := bmc.ShareReads(bg)
				if err := drv.SetBootOverride(ctx, bmc.BootOverride{Device: bmc.BootPXE}); err != nil {
					b.Fatal(err)
				}
				ps, err := drv.PowerState(ctx)
				if err != nil {
					b.Fatal(err)
				}
				a := bmc.PowerActionOn
				if ps == bmc.PowerOn {
					a = bmc.PowerActionReset
				}
				if err := drv.Power(ctx, a); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				for _, r := range sim.Requests() {
					reqs++
					if r.Method == http.MethodGet && r.Path == "/redfish/v1/Systems/System.Embedded.1" {
						sysGets++
					}
				}
				sim.ClearRequests()
				pw.Set(false)
				b.StartTimer()
			}
			b.ReportMetric(float64(reqs)/float64(b.N), "req/netboot")
			b.ReportMetric(float64(sysGets)/float64(b.N), "sysGET/netboot")
			_ = drv.Close(bg)
		})
	}
}
