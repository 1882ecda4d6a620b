package gitops

import (
	"os"
	"path/filepath"
	"testing"
)

// TestSourceRecoversTornRef: a controller killed while go-git rewrote the
// clone's remote-tracking ref leaves that file empty; the restarted
// source drops it and fetches again. Before the fix every later fetch
// failed with "ref file is empty" and the controller stayed on its last
// good revision (seen in TestCrashConvergence).
func TestSourceRecoversTornRef(t *testing.T) {
	r := newTestRepo(t)
	var ev eventLog
	dir := t.TempDir()
	mustPoll(t, newTestSource(t, r, dir, &ev))
	var torn []string
	_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() && filepath.Base(filepath.Dir(p)) == "origin" {
			torn = append(torn, p)
		}
		return nil
	})
	if len(torn) == 0 {
		t.Fatal("no remote-tracking ref file after the first poll")
	}
	for _, p := range torn {
		if err := os.Truncate(p, 0); err != nil {
			t.Fatal(err)
		}
	}
	c := r.edit("servers.yaml", "actions: {commission: 0, powerCycle: 0}", "actions: {commission: 1, powerCycle: 0}", "commission r1-n01")
	r.push(false)
	s := newTestSource(t, r, dir, &ev) // the restart
	mustPoll(t, s)
	if good, inv := s.Latest(); inv != nil || good.Commit != c.String() {
		t.Fatalf("after the torn ref: Latest = %s (invalid %v), want %s", good.Commit, inv, c)
	}
}
