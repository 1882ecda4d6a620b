package gitops

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// lineCounter is a slog handler that counts records by message.
type lineCounter struct {
	mu    sync.Mutex
	lines map[string]int
}

func (c *lineCounter) Enabled(context.Context, slog.Level) bool { return true }
func (c *lineCounter) Handle(_ context.Context, r slog.Record) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.lines == nil {
		c.lines = map[string]int{}
	}
	c.lines[r.Message]++
	return nil
}
func (c *lineCounter) WithAttrs([]slog.Attr) slog.Handler { return c }
func (c *lineCounter) WithGroup(string) slog.Handler      { return c }
func (c *lineCounter) count(msg string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lines[msg]
}

// fakeClock is a settable time for the pacing of failure logs.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (f *fakeClock) now() time.Time { f.mu.Lock(); defer f.mu.Unlock(); return f.t }
func (f *fakeClock) add(d time.Duration) {
	f.mu.Lock()
	f.t = f.t.Add(d)
	f.mu.Unlock()
}

// refuseReceive installs a pre-receive hook in the bare repository that
// refuses every push (exit 1), as a Git server's branch protection or a
// full disk does; the returned func removes it.
func refuseReceive(t *testing.T, bare string) func() {
	t.Helper()
	hook := filepath.Join(bare, "hooks", "pre-receive")
	if err := os.MkdirAll(filepath.Dir(hook), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(hook, []byte("#!/bin/sh\necho 'refused by policy' >&2\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return func() {
		if err := os.Remove(hook); err != nil {
			t.Fatal(err)
		}
	}
}

// TestStatusHealthRefusedPush: a remote whose pre-receive hook refuses
// every push makes each write fail; Health counts the consecutive
// failures with the remote's error, the failure is logged when it starts
// and then at most once per failureLogEvery (not once, not every pass),
// and the next successful write resets the count and keeps the time of
// the success.
func TestStatusHealthRefusedPush(t *testing.T) {
	r := newTestRepo(t)
	lc := &lineCounter{}
	clk := &fakeClock{t: time.Date(2026, 12, 6, 3, 0, 0, 0, time.UTC)}
	w := newTestWriter(t, r, func(c *StatusConfig) { c.Logger = slog.New(lc); c.Attempts = 1 })
	w.now = clk.now
	allow := refuseReceive(t, r.bare)
	s := sampleSnapshot()
	const fails = 8
	for i := range fails {
		if _, err := w.Write(t.Context(), s); err == nil {
			t.Fatalf("write %d to a refusing remote succeeded", i)
		}
		clk.add(time.Minute)
	}
	h := w.Health()
	if h.ConsecutiveFailures != fails || !h.Failing || !strings.Contains(h.LastError, "pre-receive hook declined") {
		t.Errorf("health after %d refused pushes = %+v", fails, h)
	}
	// 8 failures a minute apart, failing from the 3rd (FailingAfter):
	// "failing" at the 3rd, "still failing" at the 8th (5 min later).
	if got := lc.count("status write-back failing"); got != 1 {
		t.Errorf("%d \"failing\" lines, want 1", got)
	}
	if got := lc.count("status write-back still failing"); got != 1 {
		t.Errorf("%d \"still failing\" lines over 5 minutes of failing writes, want 1", got)
	}
	allow()
	res, err := w.Write(t.Context(), s)
	if err != nil || res.Commit == "" {
		t.Fatalf("write after the remote accepts again = %+v, %v", res, err)
	}
	h = w.Health()
	if h.ConsecutiveFailures != 0 || h.Failing || h.LastError != "" || !h.LastSuccess.Equal(clk.now()) || h.LastCommit != res.Commit || h.LastPackBytes != res.PackBytes {
		t.Errorf("health after recovery = %+v", h)
	}
	if lc.count("status write-back recovered") != 1 {
		t.Error("recovery not logged")
	}
}

// TestSourceHealthUnreachable: polls of a remote that has gone count as
// consecutive failures in Health, logged when the outage starts and then
// at the failureLogEvery pace; the first poll that works again resets
// them, and Health names the remote tip and the tip evaluated (Behind 0).
func TestSourceHealthUnreachable(t *testing.T) {
	r := newTestRepo(t)
	lc := &lineCounter{}
	clk := &fakeClock{t: time.Date(2026, 12, 6, 3, 0, 0, 0, time.UTC)}
	s, err := NewSource(SourceConfig{Remote: Remote{URL: r.url()}, StateDir: t.TempDir(), Logger: slog.New(lc)})
	if err != nil {
		t.Fatal(err)
	}
	s.now = clk.now
	if err := s.Poll(t.Context()); err != nil {
		t.Fatal(err)
	}
	tip := r.remoteHead("main").String()
	if h := s.Health(); h.ConsecutiveFailures != 0 || !h.LastSuccess.Equal(clk.now()) || h.RemoteTip != tip || h.Evaluated != tip || h.Behind != 0 {
		t.Errorf("health after a good poll = %+v", h)
	}
	moved := r.bare + ".gone"
	if err := os.Rename(r.bare, moved); err != nil {
		t.Fatal(err)
	}
	const fails = 12
	for i := range fails {
		clk.add(time.Minute)
		if err := s.Poll(t.Context()); err == nil {
			t.Fatalf("poll %d of a missing remote succeeded", i)
		}
	}
	h := s.Health()
	if h.ConsecutiveFailures != fails || h.LastError == "" || !h.LastAttempt.Equal(clk.now()) || h.LastSuccess.Equal(clk.now()) {
		t.Errorf("health after %d failed polls = %+v", fails, h)
	}
	// Failures at minutes 1..12: the first logged at once, then minutes 6
	// and 11 as "still unreachable".
	if got := lc.count("inventory remote unreachable, keeping last good revision"); got != 1 {
		t.Errorf("%d outage lines, want 1", got)
	}
	if got := lc.count("inventory remote still unreachable, keeping last good revision"); got != 2 {
		t.Errorf("%d \"still unreachable\" lines over 11 minutes, want 2", got)
	}
	if err := os.Rename(moved, r.bare); err != nil {
		t.Fatal(err)
	}
	clk.add(time.Minute)
	if err := s.Poll(t.Context()); err != nil {
		t.Fatal(err)
	}
	if h := s.Health(); h.ConsecutiveFailures != 0 || h.LastError != "" || !h.LastSuccess.Equal(clk.now()) {
		t.Errorf("health after recovery = %+v", h)
	}
}

// TestSourceBehind counts the commits the listed remote tip is ahead of
// the evaluated one, and -1 for a tip the clone does not hold.
func TestSourceBehind(t *testing.T) {
	r := newTestRepo(t)
	s, err := NewSource(SourceConfig{Remote: Remote{URL: r.url()}, StateDir: t.TempDir(), Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Poll(t.Context()); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		r.commit(fmt.Sprintf("status %d", i), map[string]string{"status/README.md": fmt.Sprintf("# %d\n", i)})
	}
	r.push(false)
	o, err := s.cfg.Remote.options()
	if err != nil {
		t.Fatal(err)
	}
	// Fetched but not yet evaluated (as between a poll's fetch and its
	// evaluation, or when the evaluation failed to read the clone).
	tip, err := fetchBranch(t.Context(), s.repo, o, "main", 0)
	if err != nil {
		t.Fatal(err)
	}
	s.noteRemoteTip(tip)
	if got := s.behind(); got != 3 {
		t.Errorf("behind = %d, want 3", got)
	}
	s.noteRemoteTip(r.commit("not pushed", map[string]string{"status/README.md": "x\n"}))
	if got := s.behind(); got != -1 {
		t.Errorf("behind with the tip not in the clone = %d, want -1", got)
	}
}
