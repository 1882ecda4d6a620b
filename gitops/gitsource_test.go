package gitops

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/machina-metal/machina/inventory"
)

func newTestSource(t *testing.T, r *testRepo, stateDir string, log *eventLog) *Source {
	t.Helper()
	if stateDir == "" {
		stateDir = t.TempDir()
	}
	s, err := NewSource(SourceConfig{Remote: Remote{URL: r.url()}, StateDir: stateDir, OnEvent: log.add, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func mustPoll(t *testing.T, s *Source) {
	t.Helper()
	if err := s.Poll(t.Context()); err != nil {
		t.Fatalf("Poll: %v", err)
	}
}

func changedNow(s *Source) bool {
	select {
	case <-s.Changed():
		return true
	default:
		return false
	}
}

func TestSourceNewRevision(t *testing.T) {
	r := newTestRepo(t)
	var ev eventLog
	s := newTestSource(t, r, "", &ev)
	if good, inv := s.Latest(); good.Commit != "" || inv != nil {
		t.Fatalf("Latest before poll = %+v, %v; want zero", good, inv)
	}
	mustPoll(t, s)
	good, inv := s.Latest()
	if inv != nil {
		t.Fatalf("seed invalid: %+v", inv.Errors)
	}
	if good.Commit != r.remoteHead("main").String() || !strings.HasPrefix(good.Digest, "sha256:") || len(good.Inventory.Servers) != 12 {
		t.Fatalf("Latest = %s %s %d servers; want seed commit, a digest, 12 servers", good.Commit, good.Digest, len(good.Inventory.Servers))
	}
	if !changedNow(s) {
		t.Error("Changed() not signalled for the first revision")
	}
	// Polling again with nothing new is a no-op.
	mustPoll(t, s)
	if changedNow(s) {
		t.Error("Changed() signalled without a change")
	}

	c := r.edit("servers.yaml", "actions: {commission: 0, powerCycle: 0}", "actions: {commission: 1, powerCycle: 0}", "commission r1-n01")
	r.push(false)
	mustPoll(t, s)
	good2, inv := s.Latest()
	if inv != nil || good2.Commit != c.String() || good2.Digest == good.Digest {
		t.Fatalf("after edit Latest = %s %s (invalid %v); want commit %s with a new digest", good2.Commit, good2.Digest, inv, c)
	}
	if got := good2.Inventory.Server("r1-n01").Actions.Commission; got != 1 {
		t.Errorf("r1-n01 commission = %d, want 1", got)
	}
	if !changedNow(s) {
		t.Error("Changed() not signalled for the new revision")
	}
	want := []SourceEventKind{SourceNewRevision, SourceNewRevision}
	if diff := cmp.Diff(want, ev.kinds()); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
	if last := ev.evs[1]; last.Previous != good.Commit || last.Digest != good2.Digest {
		t.Errorf("event = %+v, want previous %s digest %s", last, good.Commit, good2.Digest)
	}
}

func TestSourceNoOpCommits(t *testing.T) {
	r := newTestRepo(t)
	var ev eventLog
	s := newTestSource(t, r, "", &ev)
	mustPoll(t, s)
	good, _ := s.Latest()
	<-s.Changed()

	for _, step := range []struct {
		name  string
		files map[string]string
	}{
		{"README only", map[string]string{"README.md": "# edited\n"}},
		{"status only", map[string]string{"status/servers/r1-n01.yaml": "name: r1-n01\nlifecycle: ready\n", "status/README.md": "# Fleet\n"}},
		{"comment in servers.yaml", map[string]string{"servers.yaml": "# a new comment\n" + r.read("servers.yaml")}},
		{"reformatted servers.yaml", map[string]string{"servers.yaml": strings.ReplaceAll(r.read("servers.yaml"), "tags: [nvme, kvm]", "tags: [ nvme,  kvm ]")}},
	} {
		c := r.commit(step.name, step.files)
		r.push(false)
		mustPoll(t, s)
		got, inv := s.Latest()
		if inv != nil || got.Commit != good.Commit || got.Digest != good.Digest {
			t.Errorf("%s (commit %s): Latest = %s %s, invalid %v; want unchanged %s", step.name, short(c), got.Commit, got.Digest, inv, good.Commit)
		}
		if changedNow(s) {
			t.Errorf("%s: Changed() signalled", step.name)
		}
	}
	if len(ev.evs) != 1 {
		t.Errorf("events = %v, want only the first NewRevision", ev.kinds())
	}
}

func TestSourceInvalidKeepsLastGood(t *testing.T) {
	r := newTestRepo(t)
	var ev eventLog
	s := newTestSource(t, r, "", &ev)
	mustPoll(t, s)
	good, _ := s.Latest()

	// A good change and a bad one in the same commit: nothing of it applies.
	content := r.read("servers.yaml")
	content = strings.Replace(content, "actions: {commission: 0, powerCycle: 0}", "actions: {commission: 1, powerCycle: 0}", 1)
	content = strings.Replace(content, `bootMAC: "52:54:00:01:00:02"`, `bootMAC: "52:54:00:01:00:zz"`, 1)
	bad := r.commit("bad MAC", map[string]string{"servers.yaml": content})
	r.push(false)
	mustPoll(t, s)
	got, inv := s.Latest()
	if got.Commit != good.Commit || got.Digest != good.Digest {
		t.Fatalf("good after invalid = %s, want %s", got.Commit, good.Commit)
	}
	if got.Inventory.Server("r1-n01").Actions.Commission != 0 {
		t.Fatal("half of the invalid revision was applied")
	}
	if inv == nil || inv.Commit != bad.String() || len(inv.Errors) == 0 {
		t.Fatalf("invalid = %+v, want commit %s with errors", inv, bad)
	}
	line := 1 + slices.Index(strings.Split(content, "\n"), `    bootMAC: "52:54:00:01:00:zz"`)
	e := inv.Errors[0]
	if e.File != "servers.yaml" || e.Line != line || !strings.Contains(e.Error(), "bootMAC") {
		t.Errorf("first error = %q, want servers.yaml:%d about bootMAC", e.Error(), line)
	}
	if !changedNow(s) {
		t.Error("Changed() not signalled for the invalid revision")
	}
	// A further no-op commit keeps reporting the same invalid revision.
	r.commit("readme", map[string]string{"README.md": "x\n"})
	r.push(false)
	mustPoll(t, s)
	if _, inv2 := s.Latest(); inv2 == nil || inv2.Commit != bad.String() {
		t.Errorf("invalid after README commit = %+v", inv2)
	}
	// Fixing it restores validity; the fix carries the commission bump.
	fixed := r.edit("servers.yaml", "52:54:00:01:00:zz", "52:54:00:01:00:02", "fix MAC")
	r.push(false)
	mustPoll(t, s)
	got, inv = s.Latest()
	if inv != nil || got.Commit != fixed.String() || got.Inventory.Server("r1-n01").Actions.Commission != 1 {
		t.Errorf("after fix Latest = %s (invalid %v), want %s with commission 1", got.Commit, inv, fixed)
	}
	want := []SourceEventKind{SourceNewRevision, SourceInvalidRevision, SourceNewRevision, SourceRevisionFixed}
	if diff := cmp.Diff(want, ev.kinds()); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
}

func TestSourceMissingServersFileIsInvalid(t *testing.T) {
	r := newTestRepo(t)
	s := newTestSource(t, r, "", &eventLog{})
	mustPoll(t, s)
	r.commit("remove servers", map[string]string{"servers.yaml": ""})
	r.push(false)
	mustPoll(t, s)
	good, inv := s.Latest()
	if good.Commit == "" || inv == nil || len(inv.Errors) == 0 {
		t.Fatalf("Latest = %s, %+v; want last good kept and an invalid revision", good.Commit, inv)
	}
	t.Logf("missing servers.yaml reported as: %v", inv.Errors[0].Error())
}

func TestSourceForcePush(t *testing.T) {
	r := newTestRepo(t)
	var ev eventLog
	s := newTestSource(t, r, "", &ev)
	seed := r.remoteHead("main")
	r.edit("servers.yaml", "actions: {commission: 0, powerCycle: 0}", "actions: {commission: 1, powerCycle: 0}", "A")
	r.push(false)
	mustPoll(t, s)
	a, _ := s.Latest()

	// Rewrite history: a different change on top of the seed.
	r.resetTo(seed)
	b := r.edit("servers.yaml", "actions: {commission: 0, powerCycle: 0}", "actions: {commission: 0, powerCycle: 3}", "B")
	if err := r.tryPush(false); err == nil {
		t.Fatal("non-force push of rewritten history succeeded; test set-up broken")
	}
	r.push(true)
	mustPoll(t, s)
	got, inv := s.Latest()
	if inv != nil || got.Commit != b.String() || got.Digest == a.Digest {
		t.Fatalf("after force-push Latest = %s %s, want %s with a new digest", got.Commit, got.Digest, b)
	}
	if n := got.Inventory.Server("r1-n01").Actions; n.PowerCycle != 3 || n.Commission != 0 {
		t.Errorf("r1-n01 actions = %+v, want the rewritten head's", n)
	}
	var rewritten *SourceEvent
	for i := range ev.evs {
		if ev.evs[i].Kind == SourceHistoryRewritten {
			rewritten = &ev.evs[i]
		}
	}
	if rewritten == nil || rewritten.Previous != a.Commit || rewritten.Commit != b.String() {
		t.Errorf("events = %+v, want HistoryRewritten from %s to %s", ev.evs, a.Commit, b)
	}
}

func TestSourceUnreachableKeepsLastGood(t *testing.T) {
	r := newTestRepo(t)
	var ev eventLog
	s := newTestSource(t, r, "", &ev)
	mustPoll(t, s)
	good, _ := s.Latest()
	hidden := r.bare + ".away"
	if err := os.Rename(r.bare, hidden); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := s.Poll(t.Context()); err == nil {
			t.Fatal("Poll of a missing remote succeeded")
		}
	}
	if got, _ := s.Latest(); got.Commit != good.Commit {
		t.Errorf("Latest during outage = %s, want %s", got.Commit, good.Commit)
	}
	if s.Err() == nil || s.failures != 3 {
		t.Errorf("Err() = %v, failures = %d; want an error and 3", s.Err(), s.failures)
	}
	if err := os.Rename(hidden, r.bare); err != nil {
		t.Fatal(err)
	}
	mustPoll(t, s)
	want := []SourceEventKind{SourceNewRevision, SourceRemoteUnreachable, SourceRemoteRecovered}
	if diff := cmp.Diff(want, ev.kinds()); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
	if s.Err() != nil {
		t.Errorf("Err() after recovery = %v", s.Err())
	}
}

func TestSourceBranchNotFound(t *testing.T) {
	r := newTestRepo(t)
	s, err := NewSource(SourceConfig{Remote: Remote{URL: r.url(), Branch: "nope"}, StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Poll(t.Context()); !errors.Is(err, ErrBranchNotFound) {
		t.Errorf("Poll = %v, want ErrBranchNotFound", err)
	}
}

func TestSourceRestartKeepsLastGood(t *testing.T) {
	r := newTestRepo(t)
	state := t.TempDir()
	s := newTestSource(t, r, state, &eventLog{})
	mustPoll(t, s)
	good, _ := s.Latest()
	r.edit("servers.yaml", "name: r1-n02", "name: r1-n01", "duplicate name")
	r.push(false)

	s2 := newTestSource(t, r, state, &eventLog{})
	if got, _ := s2.Latest(); got.Commit != good.Commit || got.Digest != good.Digest || got.Inventory == nil {
		t.Fatalf("restored Latest = %s %s, want %s", got.Commit, got.Digest, good.Commit)
	}
	mustPoll(t, s2)
	got, inv := s2.Latest()
	if got.Commit != good.Commit || inv == nil {
		t.Errorf("after poll of invalid tip: good %s invalid %+v; want good %s and an invalid revision", got.Commit, inv, good.Commit)
	}
}

func TestSourceRunTrigger(t *testing.T) {
	r := newTestRepo(t)
	s, err := NewSource(SourceConfig{Remote: Remote{URL: r.url()}, StateDir: t.TempDir(), Interval: time.Hour, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	<-s.Changed() // first poll at start
	if err := s.Run(ctx); !errors.Is(err, ErrAlreadyRunning) {
		t.Errorf("second Run = %v, want ErrAlreadyRunning", err)
	}
	c := r.edit("servers.yaml", "actions: {commission: 0, powerCycle: 0}", "actions: {commission: 2, powerCycle: 0}", "bump")
	r.push(false)
	s.Trigger()
	<-s.Changed()
	if got, _ := s.Latest(); got.Commit != c.String() {
		t.Errorf("after Trigger Latest = %s, want %s", got.Commit, c)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run = %v, want nil after cancel", err)
	}
}

func TestSourceDir(t *testing.T) {
	r := newTestRepo(t)
	files := map[string]string{}
	for _, f := range inventoryFiles {
		files["site/"+f] = r.read(f)
	}
	r.commit("move into site/", files)
	r.push(false)
	s, err := NewSource(SourceConfig{Remote: Remote{URL: r.url()}, Dir: "/site/", StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	mustPoll(t, s)
	if good, inv := s.Latest(); inv != nil || len(good.Inventory.Servers) != 12 {
		t.Errorf("Latest with Dir = %+v %+v", good, inv)
	}
	if _, err := NewSource(SourceConfig{Remote: Remote{URL: r.url()}, Dir: "../x", StateDir: t.TempDir()}); !errors.Is(err, ErrRemoteConfig) {
		t.Errorf("NewSource with Dir ../x = %v, want ErrRemoteConfig", err)
	}
}

func TestBackoffDelay(t *testing.T) {
	for _, tc := range []struct {
		failures int
		r        float64
		want     time.Duration
	}{
		{0, 0.5, 30 * time.Second},
		{0, 0, 27 * time.Second},
		{0, 0.999999, 33 * time.Second},
		{1, 0.5, 30 * time.Second},
		{2, 0.5, time.Minute},
		{3, 0.5, 2 * time.Minute},
		{5, 0.5, 8 * time.Minute},
		{6, 0.5, 10 * time.Minute},
		{60, 0.5, 10 * time.Minute},
		{60, 0, 9 * time.Minute},
	} {
		got := backoffDelay(30*time.Second, 10*time.Minute, tc.failures, tc.r)
		if got.Round(time.Second) != tc.want {
			t.Errorf("backoffDelay(30s, 10m, %d, %v) = %v, want %v", tc.failures, tc.r, got, tc.want)
		}
	}
}

func TestRemoteParse(t *testing.T) {
	dir := t.TempDir()
	tok := filepath.Join(dir, "tok")
	if err := os.WriteFile(tok, []byte("s3cr3t-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		r    Remote
		kind remoteKind
		ok   bool
	}{
		{Remote{URL: "/srv/inv.git"}, kindFile, true},
		{Remote{URL: "file:///srv/inv.git"}, kindFile, true},
		{Remote{URL: "https://git.example.org/site/inv.git", TokenFile: tok}, kindHTTP, true},
		{Remote{URL: "http://git.example.org/site/inv.git"}, kindHTTP, true},
		{Remote{URL: "http://git.example.org/site/inv.git", TokenFile: tok}, 0, false},
		{Remote{URL: "https://bot:hunter2@git.example.org/inv.git"}, 0, false},
		{Remote{URL: "ssh://git@git.example.org:2222/inv.git"}, kindSSH, true},
		{Remote{URL: "git@git.example.org:site/inv.git"}, kindSSH, true},
		{Remote{URL: "ftp://x/y"}, 0, false},
		{Remote{URL: "file://otherhost/x"}, 0, false},
		{Remote{URL: "relative/path"}, 0, false},
		{Remote{URL: ""}, 0, false},
	} {
		kind, _, err := tc.r.parse()
		if (err == nil) != tc.ok || (tc.ok && kind != tc.kind) {
			t.Errorf("parse(%q) = %v, %v; want kind %v ok %v", tc.r.URL, kind, err, tc.kind, tc.ok)
		}
		if err != nil && strings.Contains(err.Error(), "hunter2") {
			t.Errorf("parse error leaks the password: %v", err)
		}
		if err != nil && !errors.Is(err, ErrRemoteConfig) {
			t.Errorf("parse(%q) error %v does not wrap ErrRemoteConfig", tc.r.URL, err)
		}
	}
	// ssh without known_hosts is refused before any connection.
	if _, err := (Remote{URL: "ssh://git@h/x", SSHKeyFile: tok}).options(); !errors.Is(err, ErrRemoteConfig) {
		t.Errorf("ssh without known_hosts = %v, want ErrRemoteConfig", err)
	}
}

// TestSourceOversizedFile: a file over Limits.MaxFileBytes is refused from
// its blob size, before it is read, and reported as an invalid revision.
func TestSourceOversizedFile(t *testing.T) {
	r := newTestRepo(t)
	s, err := NewSource(SourceConfig{Remote: Remote{URL: r.url()}, StateDir: t.TempDir(),
		Limits: inventory.Limits{MaxFileBytes: 64 << 10}})
	if err != nil {
		t.Fatal(err)
	}
	mustPoll(t, s)
	r.commit("huge comment", map[string]string{"servers.yaml": r.read("servers.yaml") + "#" + strings.Repeat("x", 100<<10) + "\n"})
	r.push(false)
	mustPoll(t, s)
	good, inv := s.Latest()
	if good.Commit == "" || inv == nil || inv.Errors[0].File != "servers.yaml" || !strings.Contains(inv.Errors[0].Msg, "limit") {
		t.Fatalf("Latest = %s, %+v; want the last good kept and a size error", good.Commit, inv)
	}
}

// TestSourceNamesTheCommitThatBroughtTheInventory: when an operator's
// commit and status-only commits on top of it land between two polls, the
// revision (good or invalid) is named after the operator's commit, not
// the branch tip that carried it.
func TestSourceNamesTheCommitThatBroughtTheInventory(t *testing.T) {
	r := newTestRepo(t)
	var ev eventLog
	s := newTestSource(t, r, "", &ev)
	mustPoll(t, s)

	op := r.edit("servers.yaml", "tags: [nvme, kvm]", "tags: [nvme, kvm, rack-a]", "tag r1 servers")
	r.commit("status: 3 servers changed", map[string]string{"status/README.md": "# Fleet\n"})
	r.commit("status: 1 server changed", map[string]string{"status/README.md": "# Fleet again\n"})
	r.push(false)
	mustPoll(t, s)
	if good, _ := s.Latest(); good.Commit != op.String() {
		t.Errorf("good revision named %s, want the operator's commit %s", good.Commit, op)
	}

	bad := r.edit("servers.yaml", `bootMAC: "52:54:00:01:00:01"`, `bootMAC: "52:54:00:01:00"`, "typo in a boot MAC")
	r.commit("status: nothing new", map[string]string{"status/README.md": "# Fleet, third\n"})
	r.push(false)
	mustPoll(t, s)
	if _, inv := s.Latest(); inv == nil || inv.Commit != bad.String() {
		t.Errorf("invalid revision %+v, want it named after %s", inv, short(bad))
	}
}
