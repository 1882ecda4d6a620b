package gitops

import (
	"fmt"
	"io/fs"
	"os/exec"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"
	"time"

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
// live-MiB is the heap still reachable after the writes (a collection
// run, the writer and the snapshot held): what the writer keeps between
// writes, beside the benchmark's own snapshot and repository.
func BenchmarkStatusSteady10k(b *testing.B) {
	_, w, s := writtenStatus(b, 10000)
	b.ReportAllocs()
	for b.Loop() {
		res, err := w.Write(b.Context(), s)
		if err != nil || res.Commit != "" {
			b.Fatalf("Write = %+v, %v", res, err)
		}
	}
	b.StopTimer()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	b.ReportMetric(float64(ms.HeapAlloc)/(1<<20), "live-MiB")
	runtime.KeepAlive(w)
	runtime.KeepAlive(s)
}

// BenchmarkStatusGrowth10k measures what one status commit changing one
// server of a 10,000-server fleet costs: pushed-B/op is the packfile the
// push sent; remote-B/op the growth of the bare remote's objects/ as
// git-receive-pack stored them (loose objects: the pushes are below
// receive.unpackLimit); packed-B/op that growth after the host's
// `git gc` (git repack -a -d -f, deltas between versions). Times 2,880 (a
// commit every 30 s, the default Interval, all day) it is the history's
// worst-case growth per day (docs/performance.md "Status history").
func BenchmarkStatusGrowth10k(b *testing.B) {
	r, w, s := writtenStatus(b, 10000)
	gc := func() {
		if out, err := exec.Command("git", "-C", r.bare, "repack", "-a", "-d", "-f", "-q").CombinedOutput(); err != nil {
			b.Fatalf("git repack: %v\n%s", err, out)
		}
	}
	gc()
	before := dirBytes(b, filepath.Join(r.bare, "objects"))
	pushed, i := 0, 0
	for b.Loop() {
		i++
		j := (i * 7919) % len(s.Servers)
		s.Servers[j].Events = append([]StatusEvent{{Time: t0.Add(time.Duration(i) * time.Second), Type: "Normal", Reason: "PowerChanged",
			Message: fmt.Sprintf("power state observed %d", i)}}, s.Servers[j].Events...)
		res, err := w.Write(b.Context(), s)
		if err != nil || res.Commit == "" {
			b.Fatalf("Write = %+v, %v", res, err)
		}
		pushed += res.PackBytes
	}
	b.StopTimer()
	loose := dirBytes(b, filepath.Join(r.bare, "objects"))
	gc()
	packed := dirBytes(b, filepath.Join(r.bare, "objects"))
	b.ReportMetric(float64(pushed)/float64(i), "pushed-B/op")
	b.ReportMetric(float64(loose-before)/float64(i), "remote-B/op")
	b.ReportMetric(float64(packed-before)/float64(i), "packed-B/op")
}

// dirBytes is the disk use (allocated blocks) of the files under dir.
func dirBytes(b *testing.B, dir string) int64 {
	b.Helper()
	var n int64
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		if st, ok := info.Sys().(*syscall.Stat_t); ok {
			n += st.Blocks * 512
		} else {
			n += info.Size()
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	return n
}

// BenchmarkStatusFew10k measures a status commit of a 10,000-server
// fleet in which 100 servers changed since the last write (a different
// 100 each time, as during a rollout): render, build trees, push.
func BenchmarkStatusFew10k(b *testing.B) {
	_, w, s := writtenStatus(b, 10000)
	b.ReportAllocs()
	lifecycles := [2]string{"commissioning", "ready"}
	i := 0
	for b.Loop() {
		// A new slice each write: Write's callers replace statuses, never
		// change them in place.
		s.Servers = append(s.Servers[:0:0], s.Servers...)
		for j := range 100 {
			k := (i*100 + j) % len(s.Servers)
			s.Servers[k].Lifecycle = lifecycles[(i*100+j)/len(s.Servers)%2]
		}
		res, err := w.Write(b.Context(), s)
		if err != nil || res.Commit == "" {
			b.Fatalf("Write = %+v, %v", res, err)
		}
		i++
	}
}

// writtenStatus is a test remote, a status writer whose remote already
// holds the status of n ready servers, and that snapshot.
func writtenStatus(b *testing.B, n int) (*testRepo, *StatusWriter, Snapshot) {
	r := newTestRepo(b)
	w, err := NewStatusWriter(StatusConfig{Remote: Remote{URL: r.url()}, StateDir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	s := bigSnapshot(n, "ready")
	if _, err := w.Write(b.Context(), s); err != nil {
		b.Fatal(err)
	}
	return r, w, s
}
