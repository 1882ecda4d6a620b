package state_test

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/machina-metal/machina/state"
)

// TestWriteBackupOpens: on both engines WriteBackup writes a bbolt file
// (its size announced first) that Open accepts and that reads the same:
// servers, hosts, events, the join log, secrets under the same master key,
// and the event sequence continues where the site's was.
func TestWriteBackupOpens(t *testing.T) {
	eachEngine(t, func(t *testing.T) {
		key := []byte("0123456789abcdef-backup-master-key")
		s := openTest(t, state.Options{MasterKey: key})
		mustCreate(t, s, state.Server{Name: "n1", Lifecycle: state.LifecycleReady})
		mustCreate(t, s, state.Server{Name: "n2"})
		if _, err := s.Transition("n1", state.LifecycleReady, state.LifecycleAllocated, "backup"); err != nil {
			t.Fatal(err)
		}
		if _, err := s.PutSecret("bmc", state.Credential{Username: "u", Password: "pw"}, "ops"); err != nil {
			t.Fatal(err)
		}
		if _, err := s.PutHost(state.Host{Name: "h1", Server: "n1", JoinedAt: time.Now()}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.AppendJoinLog("h1", state.JoinLogEntry{Message: "joined"}); err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		var announced int64 = -1
		n, err := s.WriteBackup(&buf, func(n int64) { announced = n })
		if err != nil {
			t.Fatal(err)
		}
		if n != int64(buf.Len()) || announced != n {
			t.Fatalf("wrote %d, buffer %d, announced %d", n, buf.Len(), announced)
		}
		path := filepath.Join(t.TempDir(), "restored.db")
		if err := os.WriteFile(path, buf.Bytes(), 0o600); err != nil {
			t.Fatal(err)
		}
		r, err := state.Open(path, state.Options{MasterKey: key})
		if err != nil {
			t.Fatalf("Open(backup) = %v", err)
		}
		defer r.Close()
		if err := r.Check(); err != nil {
			t.Fatal(err)
		}
		want, _ := s.Snapshot()
		got, _ := r.Snapshot()
		if !reflect.DeepEqual(want, got) {
			t.Fatalf("restored snapshot differs:\n%+v\n%+v", want, got)
		}
		if c, err := r.Secret("bmc"); err != nil || c.Password != "pw" {
			t.Fatalf("restored secret = %v, %v", c, err)
		}
		wj, _ := s.JoinLog("h1")
		gj, _ := r.JoinLog("h1")
		if !reflect.DeepEqual(wj, gj) || len(gj) != 1 {
			t.Fatalf("join log %+v vs %+v", wj, gj)
		}
		we := allEvents(t, s, state.EventQuery{})
		ge := allEvents(t, r, state.EventQuery{})
		if !reflect.DeepEqual(we, ge) {
			t.Fatalf("events differ: %d vs %d", len(we), len(ge))
		}
		e, err := r.AppendEvent(state.Event{Message: "after restore"})
		if err != nil || e.Seq != we[len(we)-1].Seq+1 {
			t.Fatalf("next event seq %d (%v), want %d", e.Seq, err, we[len(we)-1].Seq+1)
		}
	})
}
