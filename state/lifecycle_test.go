package state_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/machina-metal/machina/state"
)

// designMoves is docs/architecture.md's "Lifecycle and power" moves, typed out again
// independently of the package's table.
var designMoves = map[string]bool{
	"new→commissioning":   true,
	"commissioning→ready": true, "commissioning→failed": true, "commissioning→new": true,
	"ready→allocated": true, "ready→commissioning": true, "ready→retired": true,
	"allocated→deploying": true, "allocated→ready": true,
	"deploying→deployed": true, "deploying→failed": true,
	"deployed→ready": true, "deployed→retired": true,
	"failed→commissioning": true, "failed→new": true, "failed→retired": true,
	"retired→new": true,
}

func TestCanTransitionMatchesDesign(t *testing.T) {
	all := state.Lifecycles()
	if len(all) != 8 {
		t.Fatalf("Lifecycles() has %d entries, want 8", len(all))
	}
	allowed := 0
	for _, from := range all {
		for _, to := range all {
			key := fmt.Sprintf("%s→%s", from, to)
			if got, want := state.CanTransition(from, to), designMoves[key]; got != want {
				t.Errorf("CanTransition(%s) = %v, want %v", key, got, want)
			}
			if state.CanTransition(from, to) {
				allowed++
			}
		}
	}
	if allowed != len(designMoves) {
		t.Errorf("%d allowed moves, want %d", allowed, len(designMoves))
	}
	if state.CanTransition("bogus", state.LifecycleNew) || state.CanTransition(state.LifecycleNew, "bogus") {
		t.Error("CanTransition accepted an unknown lifecycle")
	}
}

// TestTransitionRace64: 64 goroutines race the same move; exactly one wins,
// the others get a stale TransitionError carrying the winner's lifecycle,
// and exactly one transition event is written.
func TestTransitionRace64(t *testing.T) {
	eachEngine(t, func(t *testing.T) {
		for _, batched := range []bool{false, true} {
			t.Run(fmt.Sprintf("batched=%v", batched), func(t *testing.T) {
				s := openTest(t, state.Options{})
				mustCreate(t, s, state.Server{Name: "r1-n01", Lifecycle: state.LifecycleReady})
				const n = 64
				var wg sync.WaitGroup
				errs := make([]error, n)
				start := make(chan struct{})
				for i := range n {
					wg.Add(1)
					go func() {
						defer wg.Done()
						<-start
						m := state.Move{Server: "r1-n01", From: state.LifecycleReady, To: state.LifecycleAllocated, Actor: fmt.Sprintf("g%d", i)}
						if batched {
							_, errs[i] = s.ApplyBatched(m)
						} else {
							_, errs[i] = s.Apply(m)
						}
					}()
				}
				close(start)
				wg.Wait()
				wins := 0
				for i, err := range errs {
					if err == nil {
						wins++
						continue
					}
					var te *state.TransitionError
					if !errors.As(err, &te) || !errors.Is(err, state.ErrStaleTransition) {
						t.Errorf("goroutine %d: err = %v, want stale *TransitionError", i, err)
						continue
					}
					if te.Current != state.LifecycleAllocated {
						t.Errorf("goroutine %d: Current = %s, want allocated", i, te.Current)
					}
				}
				if wins != 1 {
					t.Fatalf("%d goroutines won, want exactly 1", wins)
				}
				evs := allEvents(t, s, state.EventQuery{Server: "r1-n01"})
				var moves int
				for _, e := range evs {
					if e.Kind == state.EventTransition {
						moves++
					}
				}
				if moves != 1 {
					t.Errorf("%d transition events, want 1", moves)
				}
				srv, err := s.Server("r1-n01")
				if err != nil || srv.Lifecycle != state.LifecycleAllocated {
					t.Errorf("Server = %v, %v; want allocated", srv.Lifecycle, err)
				}
			})
		}
	})
}

// TestTransitionProperty drives random move sequences over several servers
// and checks every result against the table and a model of the current
// lifecycle, then checks each server's lifecycle equals its last event.
func TestTransitionProperty(t *testing.T) {
	eachEngine(t, func(t *testing.T) {
		seed := rand.Uint64()
		t.Logf("seed %d", seed)
		r := rand.New(rand.NewPCG(seed, 7))
		s := openTest(t, state.Options{NoSync: true})
		names := []string{"a", "b", "c", "d"}
		model := map[string]state.Lifecycle{}
		for _, n := range names {
			mustCreate(t, s, state.Server{Name: n})
			model[n] = state.LifecycleNew
		}
		all := state.Lifecycles()
		var ok, illegal, stale int
		for step := range 3000 {
			name := names[r.IntN(len(names))]
			from := model[name]
			if r.IntN(4) == 0 { // sometimes a stale or illegal from
				from = all[r.IntN(len(all))]
			}
			var to state.Lifecycle
			if next := state.NextLifecycles(from); len(next) > 0 && r.IntN(3) != 0 {
				to = next[r.IntN(len(next))]
			} else {
				to = all[r.IntN(len(all))]
			}
			srv, err := s.Transition(name, from, to, fmt.Sprintf("step %d", step))
			var te *state.TransitionError
			switch {
			case !designMoves[fmt.Sprintf("%s→%s", from, to)]:
				illegal++
				if !errors.As(err, &te) || !errors.Is(err, state.ErrIllegalTransition) || te.Current != model[name] {
					t.Fatalf("step %d: %s %s→%s (current %s) = %v, want illegal with current", step, name, from, to, model[name], err)
				}
			case model[name] != from:
				stale++
				if !errors.As(err, &te) || !errors.Is(err, state.ErrStaleTransition) || te.Current != model[name] {
					t.Fatalf("step %d: %s %s→%s (current %s) = %v, want stale with current", step, name, from, to, model[name], err)
				}
			default:
				ok++
				if err != nil || srv.Lifecycle != to {
					t.Fatalf("step %d: %s %s→%s = %v, %v; want success", step, name, from, to, srv.Lifecycle, err)
				}
				model[name] = to
			}
		}
		t.Logf("%d accepted, %d illegal, %d stale", ok, illegal, stale)
		if ok == 0 || illegal == 0 || stale == 0 {
			t.Errorf("sequence did not exercise every outcome: %d/%d/%d", ok, illegal, stale)
		}
		for _, n := range names {
			srv, err := s.Server(n)
			if err != nil {
				t.Fatal(err)
			}
			if srv.Lifecycle != model[n] {
				t.Errorf("%s: stored %s, model %s", n, srv.Lifecycle, model[n])
			}
			evs := allEvents(t, s, state.EventQuery{Server: n})
			last := evs[len(evs)-1]
			if last.To != srv.Lifecycle {
				t.Errorf("%s: last event %+v, lifecycle %s", n, last, srv.Lifecycle)
			}
		}
	})
}

func TestTransitionErrors(t *testing.T) {
	eachEngine(t, func(t *testing.T) {
		s := openTest(t, state.Options{})
		mustCreate(t, s, state.Server{Name: "n1"})
		if _, err := s.Transition("missing", state.LifecycleNew, state.LifecycleCommissioning, ""); !errors.Is(err, state.ErrNotFound) {
			t.Errorf("missing server: err = %v, want ErrNotFound", err)
		}
		_, err := s.Transition("n1", state.LifecycleNew, state.LifecycleDeployed, "skip ahead")
		var te *state.TransitionError
		if !errors.As(err, &te) {
			t.Fatalf("illegal move: err = %v, want *TransitionError", err)
		}
		want := state.TransitionError{Server: "n1", From: state.LifecycleNew, To: state.LifecycleDeployed, Current: state.LifecycleNew, Err: state.ErrIllegalTransition}
		if diff := cmp.Diff(want, *te, cmp.Comparer(func(a, b error) bool { return errors.Is(a, b) })); diff != "" {
			t.Errorf("TransitionError (-want +got):\n%s", diff)
		}
		// Refused moves write no event.
		evs := allEvents(t, s, state.EventQuery{Server: "n1"})
		if len(evs) != 1 || evs[0].Kind != state.EventCreated {
			t.Errorf("events after refused moves = %+v, want only the creation", evs)
		}
		// Actor and reason land in the event.
		if _, err := s.Apply(state.Move{Server: "n1", From: state.LifecycleNew, To: state.LifecycleCommissioning, Reason: "commission", Actor: "ops"}); err != nil {
			t.Fatal(err)
		}
		evs = allEvents(t, s, state.EventQuery{Server: "n1"})
		got := evs[len(evs)-1]
		if got.Actor != "ops" || got.Message != "commission" || got.From != state.LifecycleNew || got.To != state.LifecycleCommissioning {
			t.Errorf("transition event = %+v", got)
		}
		// UpdateServer may not touch the lifecycle.
		if _, err := s.UpdateServer("n1", func(srv *state.Server) error { srv.Lifecycle = state.LifecycleDeployed; return nil }); !errors.Is(err, state.ErrLifecycleField) {
			t.Errorf("UpdateServer changing lifecycle: err = %v, want ErrLifecycleField", err)
		}
	})
}
