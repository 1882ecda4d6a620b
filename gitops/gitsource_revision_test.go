package gitops

import (
	"fmt"
	"testing"
)

// TestRevisionNamesHumanCommitUnderStatusCommits: with more status
// commits on top of the operator's commit than introducedBy's walk of
// other commits allows (a controller writes one every few seconds), a
// controller that polls the tip names the operator's commit, not a
// status commit.
func TestRevisionNamesHumanCommitUnderStatusCommits(t *testing.T) {
	r := newTestRepo(t)
	// Status commits as the writer makes them: status/ only, the
	// revision trailers (a real writer's are in TestStatusWriter*);
	// some below the operator's commit, more above it.
	statusCommit := func(i int) {
		r.commit(fmt.Sprintf("status: update 1 entry\n\n%s: %s\n%s: none\n", TrailerRevision, r.remoteHead("main"), TrailerDigest),
			map[string]string{"status/README.md": fmt.Sprintf("write %d\n", i)})
	}
	for i := range 3 {
		statusCommit(-i)
	}
	human := r.edit("servers.yaml", "tags: [kvm]", "tags: [kvm, racked]", "servers: tag a server")
	for i := range maxIntroWalk + 6 {
		statusCommit(i)
	}
	r.push(false)
	tip := r.remoteHead("main")
	if !isStatusCommit(r.remoteCommit(tip)) {
		t.Fatalf("tip %s is not a status commit", tip)
	}
	s, err := NewSource(SourceConfig{Remote: Remote{URL: r.url()}, StateDir: t.TempDir(), Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Poll(t.Context()); err != nil {
		t.Fatal(err)
	}
	if good, _ := s.Latest(); good.Commit != human.String() {
		t.Errorf("revision = %s, want the operator's %s under %d status commits", good.Commit, human, maxIntroWalk+6)
	}
}

// TestRevisionReresolvedAfterRewrite: when the branch is rewritten (a
// squash or amend force-pushed) with the same inventory, the revision is
// named after the commit now on the branch, not the one that left it.
func TestRevisionReresolvedAfterRewrite(t *testing.T) {
	r := newTestRepo(t)
	base := r.remoteHead("main")
	first := r.edit("servers.yaml", "name: r1-n03", "name: r1-n03 # racked", "servers: note r1-n03")
	r.push(false)
	s, err := NewSource(SourceConfig{Remote: Remote{URL: r.url()}, StateDir: t.TempDir(), Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Poll(t.Context()); err != nil {
		t.Fatal(err)
	}
	if good, _ := s.Latest(); good.Commit != first.String() {
		t.Fatalf("revision = %s, want %s", good.Commit, first)
	}
	// The operator amends the message and force-pushes.
	r.resetTo(base)
	amended := r.edit("servers.yaml", "name: r1-n03", "name: r1-n03 # racked", "servers: note that r1-n03 is racked")
	r.push(true)
	if amended == first {
		t.Fatal("amend made the same commit")
	}
	if err := s.Poll(t.Context()); err != nil {
		t.Fatal(err)
	}
	good, _ := s.Latest()
	if good.Commit != amended.String() {
		t.Errorf("revision after the rewrite = %s, want %s (the commit now on the branch)", good.Commit, amended)
	}
}
