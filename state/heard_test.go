package state_test

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/machina-metal/machina/internal/etcdtest"
	"github.com/machina-metal/machina/state"
)

// TestNoteHeardWrittenBehind: LastHeard notes are written behind the
// requests that make them: a burst of 200 notes over 100
// servers is no record write at first, then within HeardDelay the last
// note per server is written, in a few shared transactions; a note for
// an unknown server is dropped.
func TestNoteHeardWrittenBehind(t *testing.T) {
	eachEngine(t, func(t *testing.T) {
		s := openTest(t, state.Options{NoSync: true})
		const n = 100
		for i := range n {
			mustCreate(t, s, state.Server{Name: fmt.Sprintf("r1-n%03d", i)})
		}
		before, _ := s.Server("r1-n000")
		for i := range 2 * n {
			s.NoteHeard(fmt.Sprintf("r1-n%03d", i%n), fmt.Sprintf("note %d", i))
		}
		s.NoteHeard("r9-gone", "no such server")
		if got, _ := s.Server("r1-n000"); got.LastHeard != "" || got.Revision != before.Revision {
			t.Fatalf("note written at once: %q rev %d (was %d)", got.LastHeard, got.Revision, before.Revision)
		}
		deadline := time.Now().Add(5 * time.Second)
		for {
			got, _ := s.Server(fmt.Sprintf("r1-n%03d", n-1))
			if got.LastHeard != "" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("no note written within 5 s (HeardDelay %s)", state.HeardDelay)
			}
			time.Sleep(20 * time.Millisecond)
		}
		for i := range n {
			got, err := s.Server(fmt.Sprintf("r1-n%03d", i))
			if err != nil {
				t.Fatal(err)
			}
			if want := fmt.Sprintf("note %d", i+n); got.LastHeard != want || got.LastHeardAt.IsZero() {
				t.Fatalf("server %d: last heard %q at %v, want %q", i, got.LastHeard, got.LastHeardAt, want)
			}
		}
		if _, err := s.Server("r9-gone"); err == nil {
			t.Fatal("a note created a server")
		}
	})
}

// TestNoteHeardNeverRegresses: a note pending while another write
// records a later LastHeard (a report, in its own transaction) does not
// overwrite it when flushed; Close writes pending notes.
func TestNoteHeardNeverRegresses(t *testing.T) {
	eachEngine(t, func(t *testing.T) {
		clk := newClock()
		path := filepath.Join(t.TempDir(), "state.db")
		s, err := openEngine(t, path, state.Options{NoSync: true, Now: clk.Now})
		if err != nil {
			t.Fatal(err)
		}
		mustCreate(t, s, state.Server{Name: "r1-n01"})
		mustCreate(t, s, state.Server{Name: "r1-n02"})
		s.NoteHeard("r1-n01", "boot script fetched")
		clk.Advance(time.Second)
		if _, err := s.UpdateServer("r1-n01", func(srv *state.Server) error {
			srv.LastHeard, srv.LastHeardAt = "report", clk.Now()
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if err := s.FlushHeard(); err != nil {
			t.Fatal(err)
		}
		if got, _ := s.Server("r1-n01"); got.LastHeard != "report" {
			t.Fatalf("last heard %q after a stale note was flushed, want report", got.LastHeard)
		}
		s.NoteHeard("r1-n02", "deploy plan fetched")
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		s = openAt(t, path, state.Options{NoSync: true})
		if got, _ := s.Server("r1-n02"); got.LastHeard != "deploy plan fetched" {
			t.Fatalf("last heard %q after Close, want the pending note written", got.LastHeard)
		}
	})
}

// TestCloseWithEtcdGoneIsPrompt: Close writes pending LastHeard notes,
// but with etcd unreachable it waits at most about a second for that
// write instead of the write's request timeout behind every other stuck
// writer (a deposed leader's Run returned late in lab/sim's
// TestHATwoControllersFailover when Close waited for it).
func TestCloseWithEtcdGoneIsPrompt(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{})
	s, err := state.OpenEtcd(state.EtcdConfig{Endpoints: c.Endpoints(), Prefix: "/heardclose/", RequestTimeout: 10 * time.Second}, state.Options{})
	if err != nil {
		t.Fatal(err)
	}
	mustCreate(t, s, state.Server{Name: "r1-n01"})
	c.Member(0).Stop()
	s.NoteHeard("r1-n01", "boot script fetched")
	t0 := time.Now()
	_ = s.Close()
	if d := time.Since(t0); d > 3*time.Second {
		t.Fatalf("Close took %s with etcd down, want about 1 s", d)
	}
}

// TestNoteBootFetch: a boot file fetch is written behind as LastHeard
// ("boot file fetched: FILE by VIA") and as BootFetch, both at the same
// time; a later note (the ramdisk's request) moves LastHeard on and
// leaves BootFetch as the history of the last fetch.
func TestNoteBootFetch(t *testing.T) {
	eachEngine(t, func(t *testing.T) {
		clk := newClock()
		s, err := openEngine(t, filepath.Join(t.TempDir(), "state.db"), state.Options{NoSync: true, Now: clk.Now})
		if err != nil {
			t.Fatal(err)
		}
		mustCreate(t, s, state.Server{Name: "r1-n01"})
		s.NoteBootFetch("r1-n01", state.BootFetch{File: "machina/ramdisk/vmlinuz", Via: "tftp", SecureBoot: true})
		if err := s.FlushHeard(); err != nil {
			t.Fatal(err)
		}
		got, _ := s.Server("r1-n01")
		if got.LastHeard != "boot file fetched: machina/ramdisk/vmlinuz by tftp" || got.BootFetch == nil ||
			got.BootFetch.File != "machina/ramdisk/vmlinuz" || got.BootFetch.Via != "tftp" || !got.BootFetch.SecureBoot ||
			!got.BootFetch.At.Equal(got.LastHeardAt) || !got.LastHeardAt.Equal(clk.Now()) {
			t.Fatalf("after the fetch: last heard %q at %v, boot fetch %+v", got.LastHeard, got.LastHeardAt, got.BootFetch)
		}
		clk.Advance(time.Second)
		s.NoteHeard("r1-n01", "commissioning report")
		if err := s.FlushHeard(); err != nil {
			t.Fatal(err)
		}
		got, _ = s.Server("r1-n01")
		if got.LastHeard != "commissioning report" || got.BootFetch == nil || got.BootFetch.At.Equal(got.LastHeardAt) {
			t.Fatalf("after the report: last heard %q at %v, boot fetch %+v", got.LastHeard, got.LastHeardAt, got.BootFetch)
		}
	})
}
