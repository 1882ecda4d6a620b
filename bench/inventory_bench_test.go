// Package bench holds the performance benchmarks and scripts of Machina.
// Run: go test ./bench -bench . -benchmem -run '^$'
package bench

import (
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/machina-metal/machina/bench/inventorygen"
	"github.com/machina-metal/machina/inventory"
)

// BenchmarkValidate10k: parse, schema-validate and cross-check an inventory
// of 10,000 servers, 200 profiles and 50 images (target: under 1 s and under
// 200 MB peak on a 2-core machine). Reports the process's peak RSS too.
func BenchmarkValidate10k(b *testing.B) {
	benchValidate(b, inventorygen.Size{Servers: 10000, Profiles: 200, Images: 50})
}

// BenchmarkValidate10kNetworks is BenchmarkValidate10k with networks.yaml
// (201 subnets), a bonded layout on every profile and a fixed address on
// every server: the network checks' cost at the same size (same targets).
func BenchmarkValidate10kNetworks(b *testing.B) {
	benchValidate(b, inventorygen.Size{Servers: 10000, Profiles: 200, Images: 50, Networks: true})
}

func benchValidate(b *testing.B, sz inventorygen.Size) {
	dir := b.TempDir()
	if err := inventorygen.Write(dir, sz); err != nil {
		b.Fatal(err)
	}
	fsys := os.DirFS(dir)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		res, err := inventory.Load(fsys, inventory.Limits{})
		if err != nil {
			b.Fatal(err)
		}
		if len(res.Inventory.Servers) != 10000 {
			b.Fatalf("%d servers", len(res.Inventory.Servers))
		}
	}
	b.StopTimer()
	runtime.GC()
	b.ReportMetric(peakRSSMiB(), "peakRSS-MiB")
}

// peakRSSMiB reads VmHWM, the process's resident-set high-water mark.
func peakRSSMiB() float64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmHWM:" {
			kb, _ := strconv.ParseFloat(f[1], 64)
			return kb / 1024
		}
	}
	return -1
}
