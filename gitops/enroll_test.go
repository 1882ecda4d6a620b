package gitops

import (
	"context"
	"errors"
	"fmt"
	"net"
	"reflect"
	"strings"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	git "github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/plumbing"

	"github.com/machina-metal/machina/boot"
	"github.com/machina-metal/machina/discover"
	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/reconciler/plan/plantest"
	"github.com/machina-metal/machina/state"
)

var openEnrolStore = plantest.Store

func mustMAC(t *testing.T, s string) net.HardwareAddr {
	t.Helper()
	m, err := net.ParseMAC(s)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestEnrolledName(t *testing.T) {
	got := EnrolledName(mustMAC(t, "52:54:00:AA:0b:01"))
	if got != "auto-525400aa0b01" || !state.ValidName(got) {
		t.Errorf("EnrolledName = %q, want auto-525400aa0b01 (an RFC 1123 label)", got)
	}
}

// TestEnrollerDiscovered: an unknown MAC becomes a commissioning server
// with no BMC, once; a second discovery (the iPXE request after DHCP) finds
// the same server; invalid MACs and MACs servers.yaml names are refused.
func TestEnrollerDiscovered(t *testing.T) {
	st := openEnrolStore(t)
	inv := plantest.Example(t)
	var enrolled []string
	e, err := NewEnroller(EnrollConfig{Store: st, Desired: func() *inventory.Inventory { return inv }, Zone: "lab-new",
		OnEnrolled: func(n string) { enrolled = append(enrolled, n) }, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	mac := mustMAC(t, "52:54:00:aa:00:01")
	a, err := e.Discovered(ctx, boot.Discovery{MAC: mac, Source: "dhcp", Arch: 0})
	if err != nil {
		t.Fatal(err)
	}
	if a.Name != "auto-525400aa0001" || a.Lifecycle != boot.LifecycleCommissioning || a.Mode != boot.ModeBIOS {
		t.Errorf("assignment = %+v, want auto-525400aa0001 commissioning bios", a)
	}
	srv, err := st.Server(a.Name)
	if err != nil {
		t.Fatal(err)
	}
	if srv.Zone != "lab-new" || srv.BootMAC != "52:54:00:aa:00:01" || !reflect.DeepEqual(srv.BMC, state.BMCFacts{}) || srv.Enrolled == nil || srv.Enrolled.Source != "dhcp" ||
		srv.Lifecycle != state.LifecycleCommissioning || srv.BootMode != "bios" {
		t.Errorf("server = %+v", srv)
	}
	// Idempotent: the iPXE request of the same boot, and a concurrent burst.
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b, err := e.Discovered(ctx, boot.Discovery{MAC: mac, Source: "ipxe", Arch: -1})
			if err != nil || b.Name != a.Name || b.Lifecycle != boot.LifecycleCommissioning {
				t.Errorf("second Discovered = %+v, %v", b, err)
			}
		}()
	}
	wg.Wait()
	if len(enrolled) != 1 {
		t.Errorf("OnEnrolled called %d times, want 1", len(enrolled))
	}
	counts, _ := st.CountServers()
	if counts[state.LifecycleCommissioning] != 1 || len(counts) != 1 {
		t.Errorf("servers = %v, want one commissioning", counts)
	}
	evs, _ := st.Events(state.EventQuery{Server: a.Name})
	var kinds []string
	for _, ev := range evs {
		kinds = append(kinds, string(ev.Kind))
	}
	if got := strings.Join(kinds, ","); got != "server.created,boot.enrolled,lifecycle" {
		t.Errorf("events = %s", got)
	}

	for _, tc := range []struct {
		mac  string
		want error
	}{
		{"01:00:5e:00:00:01", boot.ErrInvalidMAC}, // multicast
		{"00:00:00:00:00:00", boot.ErrInvalidMAC},
		{"02:00:00:00:00:00:00:01", boot.ErrInvalidMAC}, // EUI-64
		{inv.Servers[0].BootMAC, boot.ErrNotFound},      // servers.yaml names it
	} {
		if _, err := e.Discovered(ctx, boot.Discovery{MAC: mustMAC(t, tc.mac), Source: "ipxe", Arch: -1}); !errors.Is(err, tc.want) {
			t.Errorf("Discovered(%s) = %v, want %v", tc.mac, err, tc.want)
		}
	}
	if counts, _ := st.CountServers(); counts[state.LifecycleCommissioning] != 1 || len(counts) != 1 {
		t.Errorf("refused MACs created servers: %v", counts)
	}
}

// TestEnrollerCap: at most Max servers pending review; a flood of random
// MACs is refused with one event a minute, and room frees up when a
// pending server is merged into servers.yaml or retired.
func TestEnrollerCap(t *testing.T) {
	st := openEnrolStore(t)
	var mu sync.Mutex
	var desired *inventory.Inventory
	now := time.Date(2026, 11, 29, 21, 0, 0, 0, time.UTC)
	e, err := NewEnroller(EnrollConfig{Store: st, Max: 3, Now: func() time.Time { return now },
		Desired: func() *inventory.Inventory { mu.Lock(); defer mu.Unlock(); return desired }})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	disc := func(i int) error {
		_, err := e.Discovered(ctx, boot.Discovery{MAC: mustMAC(t, fmt.Sprintf("02:00:00:00:%02x:%02x", i>>8, i&0xff)), Source: "dhcp", Arch: 7})
		return err
	}
	for i := range 3 {
		if err := disc(i); err != nil {
			t.Fatal(err)
		}
	}
	for i := 3; i < 200; i++ {
		if err := disc(i); !errors.Is(err, ErrEnrollLimit) {
			t.Fatalf("Discovered #%d = %v, want ErrEnrollLimit", i, err)
		}
	}
	snap, _ := st.Snapshot()
	if len(snap.Servers) != 3 {
		t.Fatalf("%d servers, want 3", len(snap.Servers))
	}
	refusals := func() int {
		evs, _ := st.Events(state.EventQuery{Limit: state.MaxPageSize})
		n := 0
		for _, ev := range evs {
			if ev.Kind == "boot.enroll_refused" {
				n++
			}
		}
		return n
	}
	if n := refusals(); n != 1 {
		t.Errorf("%d refusal events for 197 refusals within a minute, want 1", n)
	}
	// Already enrolled MACs still get their answer at the cap.
	if err := disc(1); err != nil {
		t.Errorf("enrolled MAC at the cap: %v", err)
	}
	// Merge one into servers.yaml, retire another: two free places.
	mu.Lock()
	desired = &inventory.Inventory{Servers: []inventory.Server{{Name: "r9-n01", Zone: "z", BootMAC: "02:00:00:00:00:00"}}}
	mu.Unlock()
	if _, err := st.Transition("auto-020000000001", state.LifecycleCommissioning, state.LifecycleFailed, "test"); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Transition("auto-020000000001", state.LifecycleFailed, state.LifecycleRetired, "test"); err != nil {
		t.Fatal(err)
	}
	for i := 300; i < 302; i++ {
		if err := disc(i); err != nil {
			t.Errorf("after freeing places: %v", err)
		}
	}
	if err := disc(302); !errors.Is(err, ErrEnrollLimit) {
		t.Errorf("over the cap again = %v", err)
	}
	now = now.Add(2 * time.Minute)
	if err := disc(303); !errors.Is(err, ErrEnrollLimit) {
		t.Errorf("over the cap again = %v", err)
	}
	if n := refusals(); n != 2 {
		t.Errorf("%d refusal events, want 2 (one a minute)", n)
	}
}

// TestEnrollerProposes: once commissioning ends, the enrolled servers'
// entries are pushed to a discovered/DATE branch of the inventory remote
// in one commit, valid against the branch's profiles and images, with no
// bmc block; main is untouched. A second pass proposes nothing; a new
// enrolment the same day gets discovered/DATE-2. With CommitTo main the
// entry lands on main.
func TestEnrollerProposes(t *testing.T) {
	repo := newTestRepo(t)
	st := openEnrolStore(t)
	inv := plantest.Example(t)
	day := time.Date(2026, 11, 29, 21, 0, 0, 0, time.UTC)
	clock := func() time.Time { return day }
	prop, err := NewProposer(ProposerConfig{Remote: Remote{URL: repo.url()}, StateDir: t.TempDir(), Now: clock, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	e, err := NewEnroller(EnrollConfig{Store: st, Desired: func() *inventory.Inventory { return inv }, Zone: "zone-a", Proposer: prop, Now: clock, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	mainBefore := repo.remoteHead("main")
	var names []string
	for _, m := range []string{"52:54:00:aa:00:01", "52:54:00:aa:00:02"} {
		a, err := e.Discovered(ctx, boot.Discovery{MAC: mustMAC(t, m), Source: "ipxe", Arch: -1})
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, a.Name)
	}
	// Still commissioning: nothing to propose yet.
	if n, err := e.ProposePending(ctx); n != 0 || err != nil {
		t.Fatalf("ProposePending while commissioning = %d, %v", n, err)
	}
	_, err = st.Apply(state.Move{Server: names[0], From: state.LifecycleCommissioning, To: state.LifecycleReady, Reason: "report",
		Update: func(s *state.Server) error {
			s.Hardware = &state.Hardware{Vendor: "QEMU", Product: "Standard PC\n# injected", Serial: "S1", Cores: 8, MemoryBytes: 32 << 30,
				Disks: []state.Disk{{Name: "sda", SizeBytes: 100 << 30}}}
			return nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Transition(names[1], state.LifecycleCommissioning, state.LifecycleFailed, "memory test failed"); err != nil {
		t.Fatal(err)
	}
	n, err := e.ProposePending(ctx)
	if err != nil || n != 2 {
		t.Fatalf("ProposePending = %d, %v; want 2", n, err)
	}
	if h := repo.remoteHead("main"); h != mainBefore {
		t.Errorf("main moved to %s", h)
	}
	branch := repo.remoteHead("discovered/2026-11-29")
	c := repo.remoteCommit(branch)
	if len(c.ParentHashes) != 1 || c.ParentHashes[0] != mainBefore || !strings.Contains(c.Message, names[0]) || !strings.Contains(c.Message, "bmc-set") {
		t.Errorf("proposal commit: parents %v, message %q", c.ParentHashes, c.Message)
	}
	servers := readRemoteServers(t, repo, branch)
	files := map[string][]byte{inventory.ServersFile: servers}
	for _, f := range inventory.Files[1:] {
		files[f] = []byte(repo.read(f))
	}
	res, err := inventory.Load(mapFSOf(files), inventory.Limits{})
	if err != nil {
		t.Fatalf("proposed inventory invalid: %v", err)
	}
	for _, name := range names {
		s := res.Inventory.Server(name)
		if s == nil || s.Zone != "zone-a" || !s.BMC.IsZero() || len(s.Tags) != 1 || s.Tags[0] != EnrolledTag {
			t.Errorf("proposed %s = %+v", name, s)
		}
	}
	if !strings.Contains(string(servers), "  # hardware: QEMU Standard PC?# injected, serial S1, 8 cores, 32 GiB memory; disks sda 100 GiB\n") {
		t.Errorf("hardware comment missing or unsanitised:\n%s", servers)
	}
	for _, name := range names {
		srv, _ := st.Server(name)
		if srv.Enrolled.Branch != "discovered/2026-11-29" || srv.Enrolled.Commit != branch.String() || srv.Enrolled.ProposedAt.IsZero() {
			t.Errorf("%s enrolment = %+v", name, srv.Enrolled)
		}
	}
	if n, err := e.ProposePending(ctx); n != 0 || err != nil {
		t.Errorf("second ProposePending = %d, %v; want nothing", n, err)
	}

	// A third machine the same day: a new branch, not a forced update.
	a, err := e.Discovered(ctx, boot.Discovery{MAC: mustMAC(t, "52:54:00:aa:00:03"), Source: "ipxe", Arch: -1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Transition(a.Name, state.LifecycleCommissioning, state.LifecycleReady, "report"); err != nil {
		t.Fatal(err)
	}
	if n, err := e.ProposePending(ctx); n != 1 || err != nil {
		t.Fatalf("third ProposePending = %d, %v", n, err)
	}
	if h := repo.remoteHead("discovered/2026-11-29"); h != branch {
		t.Errorf("first proposal branch moved")
	}
	if srv, _ := st.Server(a.Name); srv.Enrolled.Branch != "discovered/2026-11-29-2" || srv.Enrolled.Commit != repo.remoteHead("discovered/2026-11-29-2").String() {
		t.Errorf("third enrolment = %+v", srv.Enrolled)
	}

	// CommitTo main: straight onto the inventory branch.
	direct, err := NewProposer(ProposerConfig{Remote: Remote{URL: repo.url()}, StateDir: t.TempDir(), CommitTo: "main", Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewProposer(ProposerConfig{Remote: Remote{URL: repo.url()}, StateDir: t.TempDir(), CommitTo: "other"}); err == nil {
		t.Error("CommitTo another branch accepted")
	}
	p, err := direct.Propose(ctx, "add one", func(servers []byte, _ *inventory.Inventory) ([]byte, error) {
		return discover.AppendEntries(servers, []discover.Entry{{Name: "auto-525400aa0009", Zone: "zone-a", BootMAC: "52:54:00:aa:00:09", BootMode: "uefi"}})
	})
	if err != nil || p.Branch != "main" || repo.remoteHead("main").String() != p.Commit {
		t.Errorf("direct proposal = %+v, %v", p, err)
	}
	// An edit that makes the inventory invalid pushes nothing.
	before := repo.remoteHead("main")
	_, err = direct.Propose(ctx, "dup", func(servers []byte, _ *inventory.Inventory) ([]byte, error) {
		return discover.AppendEntries(servers, []discover.Entry{{Name: "auto-525400aa0009", Zone: "zone-a", BootMAC: "52:54:00:aa:00:0a"}})
	})
	var ve *inventory.ValidationError
	if !errors.As(err, &ve) || repo.remoteHead("main") != before {
		t.Errorf("invalid proposal = %v", err)
	}
}

func readRemoteServers(t *testing.T, repo *testRepo, h plumbing.Hash) []byte {
	t.Helper()
	bare, err := git.PlainOpen(repo.bare)
	if err != nil {
		t.Fatal(err)
	}
	c, err := bare.CommitObject(h)
	if err != nil {
		t.Fatal(err)
	}
	f, err := c.File(inventory.ServersFile)
	if err != nil {
		t.Fatal(err)
	}
	s, err := f.Contents()
	if err != nil {
		t.Fatal(err)
	}
	return []byte(s)
}

func mapFSOf(files map[string][]byte) fstest.MapFS {
	m := fstest.MapFS{}
	for n, b := range files {
		m[n] = &fstest.MapFile{Data: b, Mode: 0o644}
	}
	return m
}

// flakyProposer fails its first n proposals, then succeeds.
type flakyProposer struct {
	mu      sync.Mutex
	fails   int
	calls   int
	release chan struct{} // the first success waits for it
}

func (f *flakyProposer) Propose(ctx context.Context, _ string, edit func([]byte, *inventory.Inventory) ([]byte, error)) (Proposal, error) {
	f.mu.Lock()
	f.calls++
	n := f.calls
	f.mu.Unlock()
	if n <= f.fails {
		return Proposal{}, errors.New("push to https://git.example/site.git: connection refused")
	}
	select {
	case <-f.release:
	case <-ctx.Done():
		return Proposal{}, ctx.Err()
	}
	out, err := edit([]byte("servers:\n"), &inventory.Inventory{})
	if err != nil || out == nil {
		return Proposal{}, fmt.Errorf("edit: %v", err)
	}
	return Proposal{Branch: "discovered/2026-11-29", Commit: strings.Repeat("ab", 20)}, nil
}

// TestEnrollerRunRetries: Run proposes once commissioning ends, records a
// failed push on the server (status shows it) and retries with backoff
// until the push succeeds.
func TestEnrollerRunRetries(t *testing.T) {
	st := openEnrolStore(t)
	fp := &flakyProposer{fails: 2, release: make(chan struct{})}
	e, err := NewEnroller(EnrollConfig{Store: st, Proposer: fp, ProposeDelay: time.Millisecond, RetryBase: 20 * time.Millisecond, RetryCap: 50 * time.Millisecond, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run = %v", err)
		}
	}()
	a, err := e.Discovered(ctx, boot.Discovery{MAC: mustMAC(t, "52:54:00:aa:00:01"), Source: "ipxe", Arch: -1})
	if err != nil {
		t.Fatal(err)
	}
	notify, stop := st.Notify()
	defer stop()
	if _, err := st.Transition(a.Name, state.LifecycleCommissioning, state.LifecycleReady, "report"); err != nil {
		t.Fatal(err)
	}
	sawError := false
	deadline := time.After(10 * time.Second)
	for {
		srv, err := st.Server(a.Name)
		if err != nil {
			t.Fatal(err)
		}
		if srv.Enrolled.ProposalError != "" && !sawError {
			sawError = true
			if !strings.Contains(srv.Enrolled.ProposalError, "connection refused") {
				t.Errorf("ProposalError = %q", srv.Enrolled.ProposalError)
			}
			close(fp.release) // the error is visible: let a retry succeed
		}
		if srv.Enrolled.Branch != "" {
			if !sawError || srv.Enrolled.ProposalError != "" || srv.Enrolled.Commit != strings.Repeat("ab", 20) {
				t.Errorf("after retries: %+v (saw error %v)", srv.Enrolled, sawError)
			}
			break
		}
		select {
		case <-notify:
		case <-deadline:
			fp.mu.Lock()
			calls := fp.calls
			fp.mu.Unlock()
			t.Fatalf("not proposed after retries: %+v, %d calls", srv.Enrolled, calls)
		}
	}
	fp.mu.Lock()
	defer fp.mu.Unlock()
	if fp.calls != 3 {
		t.Errorf("%d proposal attempts, want 3", fp.calls)
	}
}
