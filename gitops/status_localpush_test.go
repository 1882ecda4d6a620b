package gitops

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestStatusPushToLocalRemoteOutlivesCancel: a push to a file:// remote
// runs git-receive-pack as the controller's own child, which holds the
// branch's lock file (refs/heads/main.lock) while it updates the ref. The
// writer's caller cancelling mid-push (the controller shutting down) must
// not kill that child: git leaves a SIGKILLed receive-pack's lock behind,
// and every later push to the repository then fails with "failed to
// update ref" until someone deletes the lock by hand (seen in the
// simulated lab after a controller restart). The push finishes within
// its own timeout instead, and the next push lands. Git's
// reference-transaction hook (git 2.28 and later) holds the push while
// the lock is held, so the cancel always lands inside that window.
func TestStatusPushToLocalRemoteOutlivesCancel(t *testing.T) {
	r := newTestRepo(t)
	hook := filepath.Join(r.bare, "hooks", "reference-transaction")
	if err := os.MkdirAll(filepath.Dir(hook), 0o755); err != nil {
		t.Fatal(err)
	}
	// Held only in the prepared state (the ref's lock taken), only for
	// refs/heads/main, so the test's own setup pushes are not slowed.
	script := "#!/bin/sh\nif [ \"$1\" = prepared ] && grep -q ' refs/heads/main$'; then sleep 2; fi\nexit 0\n"
	if err := os.WriteFile(hook, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	w := newTestWriter(t, r, func(c *StatusConfig) { c.Attempts = 1; c.Timeout = 20 * time.Second })
	ctx, cancel := context.WithCancel(t.Context())
	w.beforePush = func(int) { time.AfterFunc(time.Second, cancel) }
	res, err := w.Write(ctx, sampleSnapshot())
	cancel()
	lock := filepath.Join(r.bare, "refs", "heads", "main.lock")
	if _, serr := os.Stat(lock); serr == nil {
		t.Fatalf("%s left behind after a push cancelled mid-update (write: %v): every later push would fail", lock, err)
	}
	if err != nil {
		t.Fatalf("write cancelled mid-push: %v; want the local push finished within its own timeout", err)
	}
	if tip := r.remoteHead("main"); tip.String() != res.Commit {
		t.Fatalf("remote main %s, want the status commit %s", tip, res.Commit)
	}
	// The repository still takes pushes.
	if err := os.Remove(hook); err != nil {
		t.Fatal(err)
	}
	snap := sampleSnapshot()
	for name, s := range snap.Servers {
		s.LastError = "changed after the cancelled write"
		snap.Servers[name] = s
		break
	}
	res2, err := w.Write(t.Context(), snap)
	if err != nil {
		t.Fatalf("the next push: %v", err)
	}
	if tip := r.remoteHead("main"); tip.String() != res2.Commit {
		t.Fatalf("remote main %s after the next write, want %s", tip, res2.Commit)
	}
}
