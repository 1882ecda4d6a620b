package gitops

import (
	"fmt"
	"testing"

	"github.com/machina-metal/machina/inventory"
)

func bigSnapshot(n int, lifecycle string) Snapshot {
	s := Snapshot{Inventory: sampleSnapshot().Inventory}
	s.Servers = make([]ServerStatus, n)
	for i := range s.Servers {
		s.Servers[i] = ServerStatus{
			Name: fmt.Sprintf("r%03d-n%02d", i/40, i%40), Lifecycle: lifecycle, Power: "powered_on", Health: "OK",
			Hardware: Hardware{Vendor: "Dell Inc.", Model: "PowerEdge R650", CPUModel: "Intel Xeon Gold 6338", Cores: 64, MemoryGiB: 512,
				Disks: []Disk{{Name: "nvme0n1", SizeGiB: 1788}}, NICs: []NIC{{Name: "eno1", MAC: fmt.Sprintf("52:54:00:%02x:%02x:01", i/256%256, i%256)}}},
			Conditions:      []Condition{{Type: "Ready", Status: "True", Reason: "Commissioned", LastTransitionTime: t0}},
			ObservedActions: inventory.Actions{Commission: 1},
			Events:          []StatusEvent{{Time: t0, Type: "Normal", Reason: "Commissioned", Message: "commissioning report accepted"}},
		}
	}
	return s
}

// BenchmarkStatusCommit10k measures one status write (render, build trees,
// store objects, push to a file:// remote via git-receive-pack) after all
// 10,000 servers changed lifecycle. Target: under 2 s per op.
func BenchmarkStatusCommit10k(b *testing.B) {
	r := newTestRepo(b)
	w, err := NewStatusWriter(StatusConfig{Remote: Remote{URL: r.url()}, StateDir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	snaps := [2]Snapshot{bigSnapshot(10000, "ready"), bigSnapshot(10000, "commissioning")}
	if _, err := w.Write(b.Context(), snaps[1]); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		res, err := w.Write(b.Context(), snaps[i%2])
		if err != nil || res.Commit == "" {
			b.Fatalf("Write = %+v, %v", res, err)
		}
		i++
	}
}

// BenchmarkStatusSteady10k measures a write when nothing changed (render
// and hash only, no commit): what a steady fleet costs each interval.
func BenchmarkStatusSteady10k(b *testing.B) {
	r := newTestRepo(b)
	w, err := NewStatusWriter(StatusConfig{Remote: Remote{URL: r.url()}, StateDir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	s := bigSnapshot(10000, "ready")
	if _, err := w.Write(b.Context(), s); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		res, err := w.Write(b.Context(), s)
		if err != nil || res.Commit != "" {
			b.Fatalf("Write = %+v, %v", res, err)
		}
	}
}
