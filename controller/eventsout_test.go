package controller

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/machina-metal/machina/eventsout"
	"github.com/machina-metal/machina/state"
)

// TestEventsOutWiring: --webhook-out's URLs with the secret file's key
// build a sender that runs as the leader-only component "events out",
// delivers the store's events signed with that key from the controller's
// URL, and registers machina_webhook_*_total; a missing secret file or a
// non-http URL stops start-up with an error naming it.
func TestEventsOutWiring(t *testing.T) {
	dir := t.TempDir()
	st, err := state.Open(filepath.Join(dir, "state.db"), state.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	secretFile := filepath.Join(dir, "hook.secret")
	if err := os.WriteFile(secretFile, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	got := make(chan eventsout.CloudEvent, 16)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if err := eventsout.Verify([]byte("s3cret"), r.Header.Get(eventsout.HeaderTimestamp), r.Header.Get(eventsout.HeaderSignature), body, time.Now(), time.Minute); err != nil {
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		var ce eventsout.CloudEvent
		_ = json.Unmarshal(body, &ce)
		got <- ce
	}))
	defer srv.Close()
	newWiring := func(c EventsOutConfig) *wiring {
		return &wiring{cfg: Config{EventsOut: c}, log: slog.New(slog.DiscardHandler), st: st, reg: prometheus.NewRegistry(), publicURL: "http://controller.test"}
	}
	for _, bad := range []EventsOutConfig{
		{URLs: []string{srv.URL}},
		{URLs: []string{srv.URL}, SecretFile: filepath.Join(dir, "missing")},
		{URLs: []string{"ftp://hooks.example/"}, SecretFile: secretFile},
	} {
		if _, err := newWiring(bad).eventsOut(); err == nil {
			t.Errorf("eventsOut(%+v) started", bad)
		}
	}
	w := newWiring(EventsOutConfig{URLs: []string{srv.URL + "/hook"}, SecretFile: secretFile, Kinds: []string{"note"}})
	if _, err := w.eventsOut(); err != nil {
		t.Fatal(err)
	}
	comps := w.eventsOutComponent()
	if len(comps) != 1 || !isLeaderOnly(comps[0].name) {
		t.Fatalf("components %+v, want one leader-only", comps)
	}
	if _, err := st.WebhookCursor(srv.URL + "/hook"); err != nil {
		t.Fatal(err)
	}
	if _, err := st.AppendEvent(state.Event{Kind: state.EventPower, Server: "n1", Actor: state.ActorController}); err != nil {
		t.Fatal(err)
	}
	e, err := st.AppendEvent(state.Event{Message: "hello"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- comps[0].run(ctx) }()
	select {
	case ce := <-got:
		if ce.Data.Seq != e.Seq || ce.Source != "http://controller.test" || ce.Type != "io.machina.note" {
			t.Errorf("received %+v, want the note (seq %d) from http://controller.test; the power event is filtered out", ce, e.Seq)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no delivery")
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("run: %v", err)
	}
	mfs, err := w.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, mf := range mfs {
		names = append(names, mf.GetName())
	}
	if s := strings.Join(names, " "); !strings.Contains(s, "machina_webhook_dropped_total") || !strings.Contains(s, "machina_webhook_delivered_total") {
		t.Errorf("registered metrics %s", s)
	}
}
