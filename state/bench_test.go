package state_test

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/machina-metal/machina/state"
)

// BenchmarkTransition measures lifecycle compare-and-set moves with their
// event, one at a time, on each engine: bbolt (one transaction and one
// fsync per move) and etcd (one optimistic etcd transaction per move on the
// test binary's 3-member loopback cluster: its reads at one revision, then
// a Txn the members commit with fsync). Reports transitions/s.
func BenchmarkTransition(b *testing.B) {
	for _, engine := range engines {
		b.Run(engine, func(b *testing.B) {
			s := openTest(b, state.Options{})
			mustCreate(b, s, state.Server{Name: "b1", Lifecycle: state.LifecycleReady})
			cur, next := state.LifecycleReady, state.LifecycleAllocated
			for b.Loop() {
				if _, err := s.Transition("b1", cur, next, "bench"); err != nil {
					b.Fatal(err)
				}
				cur, next = next, cur
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "transitions/s")
		})
	}
}

// BenchmarkTransitionBatched measures moves with fsync through
// ApplyBatched from 64 and 256 concurrent callers (each on its own server):
// on bbolt they share commits (DB.Batch); on etcd each is its own
// transaction, serialised within the process. Reports transitions/s.
func BenchmarkTransitionBatched(b *testing.B) {
	for _, engine := range engines {
		b.Run(engine, func(b *testing.B) { benchBatched(b) })
	}
}

func benchBatched(b *testing.B) {
	for _, callers := range []int{64, 256} {
		b.Run(fmt.Sprintf("callers=%d", callers), func(b *testing.B) {
			s := openTest(b, state.Options{})
			var next atomic.Int64
			b.SetParallelism((callers + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
			b.RunParallel(func(pb *testing.PB) {
				name := fmt.Sprintf("b%d", next.Add(1))
				if _, err := s.CreateServer(state.Server{Name: name, Lifecycle: state.LifecycleReady}); err != nil {
					b.Error(err)
					return
				}
				cur, to := state.LifecycleReady, state.LifecycleAllocated
				for pb.Next() {
					if _, err := s.ApplyBatched(state.Move{Server: name, From: cur, To: to, Reason: "bench"}); err != nil {
						b.Error(err)
						return
					}
					cur, to = to, cur
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "transitions/s")
		})
	}
}

// BenchmarkReadAfterWrite measures a server read right after a write of
// the same record (the boot index after a token mint, the planner after a
// move), with a commissioning report's worth of hardware facts in the
// record, on bbolt without fsync: the decode cache is filled by the writer,
// so the read copies instead of decoding JSON.
func BenchmarkReadAfterWrite(b *testing.B) {
	s := openTest(b, state.Options{NoSync: true})
	hw := &state.Hardware{Cores: 64, MemoryBytes: 256 << 30}
	for i := range 8 {
		hw.Disks = append(hw.Disks, state.Disk{Name: fmt.Sprintf("nvme%dn1", i), SizeBytes: 3840755982336, Model: "SAMSUNG MZQL23T8HCLS-00A07", Serial: fmt.Sprintf("S64HNE0R%06d", i)})
	}
	for i := range 4 {
		hw.NICs = append(hw.NICs, state.NIC{Name: fmt.Sprintf("ens%df0", i), MAC: fmt.Sprintf("b8:ce:f6:00:00:%02x", i), SpeedMbps: 25000})
	}
	mustCreate(b, s, state.Server{Name: "b1", Lifecycle: state.LifecycleReady})
	if _, err := s.UpdateServer("b1", func(srv *state.Server) error { srv.Hardware = hw; return nil }); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if _, err := s.UpdateServer("b1", func(srv *state.Server) error { srv.LastHeard = "bench"; return nil }); err != nil {
			b.Fatal(err)
		}
		if _, err := s.Server("b1"); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSnapshot10k measures a planning pass's snapshot of 10,000
// servers (each with a commissioned hardware record of 4 disks and 2 NICs)
// on bbolt, while 1 % of them changed since the last snapshot: the
// steady state of a pass under load. B/op is what each pass allocates.
func BenchmarkSnapshot10k(b *testing.B) {
	s := openTest(b, state.Options{NoSync: true})
	const n = 10000
	fill10k(b, s, n)
	if _, err := s.Snapshot(); err != nil { // fill the decode cache
		b.Fatal(err)
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		b.StopTimer()
		for range n / 100 {
			name := fmt.Sprintf("s%05d", i%n)
			i += 37
			if _, err := s.UpdateServer(name, func(srv *state.Server) error { srv.LastError = fmt.Sprint(i); return nil }); err != nil {
				b.Fatal(err)
			}
		}
		b.StartTimer()
		snap, err := s.Snapshot()
		if err != nil {
			b.Fatal(err)
		}
		if len(snap.Servers) != n {
			b.Fatalf("snapshot holds %d servers, want %d", len(snap.Servers), n)
		}
	}
}

// createAll creates servers concurrently (their commits shared).
func createAll(b *testing.B, s *state.Store, srvs []state.Server) {
	var wg sync.WaitGroup
	for _, srv := range srvs {
		wg.Go(func() {
			if _, err := s.CreateServer(srv); err != nil {
				b.Error(err)
			}
		})
	}
	wg.Wait()
}

// fill10k creates n commissioned servers (s00000 up) in s, their commits
// shared.
func fill10k(b *testing.B, s *state.Store, n int) {
	hw := &state.Hardware{Cores: 32, MemoryBytes: 256 << 30, Vendor: "Dell Inc.", Product: "PowerEdge R650", Serial: "ABC1234",
		Disks: []state.Disk{{Name: "sda", SizeBytes: 960 << 30}, {Name: "sdb", SizeBytes: 960 << 30}, {Name: "nvme0n1", SizeBytes: 3840 << 30}, {Name: "nvme1n1", SizeBytes: 3840 << 30}},
		NICs:  []state.NIC{{Name: "eno1", MAC: "52:54:00:00:00:01"}, {Name: "eno2", MAC: "52:54:00:00:00:02"}}}
	batch := make([]state.Server, 0, 500)
	for i := range n {
		batch = append(batch, state.Server{Name: fmt.Sprintf("s%05d", i), Lifecycle: state.LifecycleReady, BootMAC: fmt.Sprintf("52:54:01:%02x:%02x:%02x", i>>16&0xff, i>>8&0xff, i&0xff), Hardware: hw})
		if len(batch) == cap(batch) || i == n-1 {
			createAll(b, s, batch)
			batch = batch[:0]
		}
	}
}

// BenchmarkCountServers10k: the lifecycle counts of 10,000 servers (the
// admin API's /status, polled by dashboards and bench/scale), read
// through the warm decode cache. Each record read used to be copied
// (936 bytes) to the heap.
func BenchmarkCountServers10k(b *testing.B) {
	s := openTest(b, state.Options{NoSync: true})
	const n = 10000
	fill10k(b, s, n)
	if _, err := s.CountServers(); err != nil { // fill the decode cache
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		counts, err := s.CountServers()
		if err != nil {
			b.Fatal(err)
		}
		if counts[state.LifecycleReady] != n {
			b.Fatalf("counts %v, want %d ready", counts, n)
		}
	}
}
