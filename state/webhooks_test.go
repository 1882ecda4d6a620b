package state_test

import (
	"path/filepath"
	"testing"

	"github.com/machina-metal/machina/state"
)

// TestWebhookCursor: a new webhook's cursor starts at the last Seq; it
// only moves forward; a move that passes dropped events appends one
// webhook.dropped event; it survives reopening the store (both engines).
func TestWebhookCursor(t *testing.T) {
	eachEngine(t, func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "state.db")
		st, err := openEngine(t, path, state.Options{NoSync: true})
		if err != nil {
			t.Fatal(err)
		}
		for range 3 {
			if _, err := st.AppendEvent(state.Event{Message: "before"}); err != nil {
				t.Fatal(err)
			}
		}
		if c, err := st.WebhookCursor("https://hooks.example/a"); err != nil || c != 3 {
			t.Fatalf("new cursor = %d, %v; want 3", c, err)
		}
		if err := st.SetWebhookCursor("https://hooks.example/a", 2, 0); err != nil {
			t.Fatal(err)
		}
		if c, _ := st.WebhookCursor("https://hooks.example/a"); c != 3 {
			t.Fatalf("cursor moved back to %d", c)
		}
		if err := st.SetWebhookCursor("https://hooks.example/a", 9, 6); err != nil {
			t.Fatal(err)
		}
		evs, err := st.Events(state.EventQuery{After: 3})
		if err != nil || len(evs) != 1 || evs[0].Kind != state.EventWebhookDropped {
			t.Fatalf("events after the drop = %+v, %v; want one webhook.dropped", evs, err)
		}
		if err := st.Close(); err != nil {
			t.Fatal(err)
		}
		st, err = openEngine(t, path, state.Options{NoSync: true})
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		if c, err := st.WebhookCursor("https://hooks.example/a"); err != nil || c != 9 {
			t.Fatalf("cursor after reopen = %d, %v; want 9", c, err)
		}
		if c, err := st.WebhookCursor("https://hooks.example/b"); err != nil || c != 4 {
			t.Fatalf("another webhook's new cursor = %d, %v; want 4 (after the drop event)", c, err)
		}
	})
}
