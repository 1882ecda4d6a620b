package plan

import (
	"fmt"
	"testing"
	"time"

	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/state"
)

// BenchmarkPlan10k: diff and plan 10,000 servers in 3 zones with 3 profiles
// whose counts need top-ups (target: under 100 ms).
func BenchmarkPlan10k(b *testing.B) {
	inv := &inventory.Inventory{Digest: "sha256:0123456789abcdef"}
	snap := state.Snapshot{Servers: map[string]state.Server{}}
	zones := []string{"zone-a", "zone-b", "zone-c"}
	for i := 0; i < 10000; i++ {
		name := fmt.Sprintf("s%05d", i)
		ws := inventory.Server{Name: name, Zone: zones[i%3], Rack: fmt.Sprintf("r%d", i/40), BootMAC: fmt.Sprintf("52:54:00:%02x:%02x:%02x", i>>16&0xff, i>>8&0xff, i&0xff),
			BootMode: inventory.BootUEFI, Want: inventory.WantReady, BMC: inventory.BMC{Driver: inventory.DriverRedfish, Address: fmt.Sprintf("https://10.1.%d.%d", i>>8&0xff, i&0xff), Credentials: "c"}}
		inv.Servers = append(inv.Servers, ws)
		o := Record(&ws)
		o.Lifecycle, o.LifecycleAt = state.LifecycleReady, time.Now()
		o.Hardware = hwOf(16+i%8, 128, 500)
		if i%10 == 0 {
			o.Lifecycle = state.LifecycleDeployed
			o.Allocation = &state.Allocation{Profile: "p-" + zones[i%3], Reason: ReasonCount, At: time.Now()}
		}
		snap.Servers[name] = o
	}
	for _, z := range zones {
		inv.Profiles = append(inv.Profiles, inventory.Profile{Name: "p-" + z, Zone: z, Image: "img", Count: 400, Min: inventory.Min{Cores: 8, MemoryGiB: 32, DiskGiB: 100}})
	}
	b.ReportAllocs()
	for b.Loop() {
		res := Compute(inv, snap, Options{Now: time.Now()})
		if len(res.Steps) == 0 {
			b.Fatal("no steps")
		}
	}
}
