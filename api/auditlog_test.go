package api_test

import (
	"context"
	"fmt"
	"testing"

	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/state"
)

// TestEventsAPIMergesAuditLog: GET /api/v1/events and a server's events
// show the audit log (what an admin token did) and the machine log
// merged in Seq order, and machine events past Retention.MaxEvents do not
// evict the audit events.
func TestEventsAPIMergesAuditLog(t *testing.T) {
	f := newFixture(t, state.Options{Retention: state.Retention{MaxEvents: 10}})
	ctx := context.Background()
	if _, err := f.store.CreateServer(state.Server{Name: "n1", Lifecycle: state.LifecycleReady}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.client.Transition(ctx, "n1", v1.TransitionRequest{From: "ready", To: "retired", Reason: "never used"}); err != nil {
		t.Fatal(err)
	}
	for i := range 30 {
		if _, err := f.store.AppendEvent(state.Event{Server: "n1", Actor: state.ActorController, Message: fmt.Sprintf("machine %d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	for _, list := range []func() (v1.EventList, error){
		func() (v1.EventList, error) { return f.client.Events(ctx, 0, 1000) },
		func() (v1.EventList, error) { return f.client.ServerEvents(ctx, "n1", 0, 1000) },
	} {
		got, err := list()
		if err != nil {
			t.Fatal(err)
		}
		audit, machine := 0, 0
		for i, e := range got.Events {
			if i > 0 && e.Seq <= got.Events[i-1].Seq {
				t.Fatalf("events not in Seq order: %d after %d", e.Seq, got.Events[i-1].Seq)
			}
			switch {
			case e.Actor == "ops" && e.Kind == string(state.EventTransition) && e.To == "retired":
				audit++
			case e.Actor == state.ActorController:
				machine++
			}
		}
		if audit != 1 || machine != 10 {
			t.Errorf("events: %d audit moves (want 1), %d machine events (want 10, MaxEvents): %+v", audit, machine, got.Events)
		}
	}
}
