package state_test

import (
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"

	"github.com/machina-metal/machina/state"
)

// BenchmarkTransition measures lifecycle moves with fsync, one at a time
// (one transaction and one fsync per move). Reports transitions/s.
func BenchmarkTransition(b *testing.B) {
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
}

// BenchmarkTransitionBatched measures moves with fsync through bbolt's
// Batch from 64 and 256 concurrent callers (each on its own server), which
// share commits. Reports transitions/s.
func BenchmarkTransitionBatched(b *testing.B) {
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
