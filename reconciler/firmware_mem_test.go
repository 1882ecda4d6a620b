package reconciler

import (
	"context"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/machina-metal/machina/bmc"
	"github.com/machina-metal/machina/bmc/bmcsim"
	"github.com/machina-metal/machina/bmc/redfish"
	"github.com/machina-metal/machina/state"
)

// memTrees are the vendor trees the simulated lab's BMCs serve (lab/sim
// simTrees), with a BIOS of 0 to 455 attributes.
var memTrees = []string{"dell-poweredge-r750-idrac9", "hpe-proliant-dl385gen10plusv2-ilo5", "lenovo-thinksystem-sr670v2-xcc",
	"supermicro-sys821ge-tnhr-x13", "dmtf-public-rackmount1", "openbmc-bmcweb-stock"}

// treeDrivers starts a bmcsim per tree and returns a Redfish driver for
// each, closed with the test.
func treeDrivers(tb testing.TB, trees []string) []bmc.Driver {
	tb.Helper()
	var out []bmc.Driver
	for _, tree := range trees {
		dir, err := bmcsim.TreeDir("", tree)
		if err != nil {
			tb.Fatal(err)
		}
		tr, err := bmcsim.LoadTree(dir)
		if err != nil {
			tb.Fatal(err)
		}
		sim, err := bmcsim.New(bmcsim.Config{Tree: tr, Username: "admin", Password: "pw", Power: bmcsim.NewMemoryPower(true), RecordLimit: 1})
		if err != nil {
			tb.Fatal(err)
		}
		ts := httptest.NewServer(sim)
		tb.Cleanup(ts.Close)
		drv, err := redfish.New(redfish.Config{Endpoint: ts.URL, Username: "admin", Password: "pw", Timeout: 5 * time.Second,
			Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { _ = drv.Close(context.Background()) })
		out = append(out, drv)
	}
	return out
}

// heapInUse is the live heap after a full collection, in bytes.
func heapInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// BenchmarkFirmwareHeldPerServer measures what a store keeps in memory
// per server for its firmware reading: 600 servers (100 per simulated
// lab tree) each store their own read through the Redfish driver over
// bmcsim (ReadFirmware, as the BMC sweep does), then every record is read
// (the decode cache filled by the writes); "B/server-written" is the live
// heap this adds per server. The store is then opened again and read cold
// (every record decoded from its JSON): "B/server-decoded".
func BenchmarkFirmwareHeldPerServer(b *testing.B) {
	const perTree = 100
	drvs := treeDrivers(b, memTrees)
	ctx := context.Background()
	for b.Loop() {
		path := filepath.Join(b.TempDir(), "state.db")
		st, err := state.Open(path, state.Options{NoSync: true})
		if err != nil {
			b.Fatal(err)
		}
		n := perTree * len(drvs)
		for i := range n {
			if _, err := st.CreateServer(state.Server{Name: fmt.Sprintf("s%04d", i), Lifecycle: state.LifecycleReady}); err != nil {
				b.Fatal(err)
			}
		}
		if _, err := st.Snapshot(); err != nil {
			b.Fatal(err)
		}
		for _, d := range drvs { // the drivers' registry caches, the trees' files
			if _, err := ReadFirmware(ctx, d, time.Now()); err != nil {
				b.Fatal(err)
			}
		}
		before := heapInUse()
		for i := range n {
			fw, err := ReadFirmware(ctx, drvs[i%len(drvs)], time.Now())
			if err != nil {
				b.Fatal(err)
			}
			if _, err := st.UpdateServer(fmt.Sprintf("s%04d", i), func(s *state.Server) error { s.Firmware = fw; return nil }); err != nil {
				b.Fatal(err)
			}
		}
		if _, err := st.Snapshot(); err != nil {
			b.Fatal(err)
		}
		written := heapInUse()
		if err := st.Close(); err != nil {
			b.Fatal(err)
		}
		st, err = state.Open(path, state.Options{NoSync: true})
		if err != nil {
			b.Fatal(err)
		}
		before2 := heapInUse()
		if _, err := st.Snapshot(); err != nil {
			b.Fatal(err)
		}
		decoded := heapInUse()
		b.ReportMetric(float64(int64(written)-int64(before))/float64(n), "B/server-written")
		b.ReportMetric(float64(int64(decoded)-int64(before2))/float64(n), "B/server-decoded")
		runtime.KeepAlive(st)
		if err := st.Close(); err != nil {
			b.Fatal(err)
		}
	}
}
