package state_test

import (
	"testing"
	"time"

	"github.com/machina-metal/machina/state"
)

// TestFenceInFlightHeartbeat: the first heartbeat to arrive after a fence
// may have left the host before its power went off (in the simulated lab a
// PDU fence was read back off 270 ms before a heartbeat sent earlier was
// handled, and the host was reported as a fence that did not hold). It is
// noted, not a fence failure: no FenceNotHeld, no event, the fence kept.
// The second one proves the host runs: FenceNotHeld counts both, one
// host.fence_failed event. A new fence forgets both.
func TestFenceInFlightHeartbeat(t *testing.T) {
	eachEngine(t, func(t *testing.T) {
		s := openTest(t, state.Options{})
		mustCreate(t, s, state.Server{Name: "r1-n01", Lifecycle: state.LifecycleDeployed})
		if _, err := s.PutHost(state.Host{Name: "hv1", Server: "r1-n01", CertFingerprint: "fp", JoinStatus: "joined"}); err != nil {
			t.Fatal(err)
		}
		fence := func() {
			t.Helper()
			if _, err := s.FenceServer("r1-n01", state.Fencing{Actor: "ops", Reason: "lost", Host: "hv1", Device: "fence ipmi 10.0.0.9"}); err != nil {
				t.Fatal(err)
			}
		}
		failed := func() int {
			n := 0
			for _, e := range allEvents(t, s, state.EventQuery{Server: "r1-n01"}) {
				if e.Kind == state.EventHostFenceFailed {
					n++
				}
			}
			return n
		}
		fence()
		now := time.Now()
		res, err := s.RecordHeartbeat("hv1", now, state.Heartbeat{Uptime: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		h, _ := s.Host("hv1")
		if !res.FencedBeat || res.FenceNotHeld || h.FenceNotHeld != nil || h.Fenced == nil || h.FencedBeat.IsZero() || failed() != 0 {
			t.Fatalf("first heartbeat after the fence: res %+v, host notHeld %+v fenced %v beat %v, %d fence_failed events; want it noted only", res, h.FenceNotHeld, h.Fenced != nil, h.FencedBeat, failed())
		}
		res, err = s.RecordHeartbeat("hv1", now.Add(time.Second), state.Heartbeat{Uptime: time.Hour + time.Second})
		if err != nil {
			t.Fatal(err)
		}
		h, _ = s.Host("hv1")
		if !res.FenceNotHeld || !res.FenceNotHeldFirst || h.FenceNotHeld == nil || h.FenceNotHeld.Heartbeats != 2 || h.Fenced == nil || failed() != 1 {
			t.Fatalf("second heartbeat: res %+v, notHeld %+v, %d fence_failed events; want the fence failure, 2 heartbeats, 1 event", res, h.FenceNotHeld, failed())
		}
		fence()
		if h, _ = s.Host("hv1"); h.FenceNotHeld != nil || !h.FencedBeat.IsZero() {
			t.Fatalf("after a new fence: notHeld %+v beat %v, want both cleared", h.FenceNotHeld, h.FencedBeat)
		}
	})
}
