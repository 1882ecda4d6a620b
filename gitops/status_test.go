package gitops

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/google/go-cmp/cmp"

	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/redact"
	"github.com/machina-metal/machina/state"
)

var update = flag.Bool("update", false, "rewrite golden files")

var t0 = time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)

func sampleSnapshot() Snapshot {
	return Snapshot{
		Inventory: InventoryStatus{
			Good: RevisionRef{Commit: "0123456789abcdef0123456789abcdef01234567", Digest: "sha256:aabbccddeeff00112233445566778899aabbccddeeff00112233445566778899"},
			Invalid: &InvalidRevision{Commit: "fedcba9876543210fedcba9876543210fedcba98", Errors: []inventory.FieldError{
				{File: "servers.yaml", Line: 14, Col: 14, Path: "servers[1].bootMAC", Msg: `"52:54:00:01:00:zz" is not a MAC address`, Severity: inventory.SeverityError},
				{File: "profiles.yaml", Line: 3, Col: 5, Path: "profiles[0].image", Msg: "image nope is not in images.yaml", Severity: inventory.SeverityError},
			}},
		},
		Servers: []ServerStatus{
			{
				Name: "r1-n02", Lifecycle: "commissioning", Power: "powered_on",
				Conditions: []Condition{
					{Type: "Ready", Status: "False", Reason: "Commissioning", Message: "waiting for the ramdisk report", LastTransitionTime: t0},
					{Type: "BMCReachable", Status: "True", Reason: "SessionOK", LastTransitionTime: t0.Add(-time.Hour)},
				},
				ObservedActions: inventory.Actions{Commission: 1},
				Events: []StatusEvent{
					{Time: t0.Add(-time.Minute), Type: "Normal", Reason: "PowerOn", Message: "power on via redfish"},
					{Time: t0, Type: "Normal", Reason: "BootOverride", Message: "boot once from PXE"},
				},
			},
			{
				Name: "r1-n01", Lifecycle: "ready", Power: "powered_off", Health: "OK", Profile: "hypervisor", Allocation: "auto",
				Addresses: []AddressStatus{{Address: "10.120.0.11", Interface: "tenant0", Subnet: "tenant", Profile: "hypervisor"},
					{Address: "10.20.0.101", Interface: "eno1", Subnet: "mgmt", Profile: "hypervisor"}},
				Hardware: Hardware{Vendor: "Dell Inc.", Model: "PowerEdge R650", Serial: "ABC1234", CPUModel: "Intel(R) Xeon(R) Gold 6338", Arch: "amd64", SMBIOSArch: "amd64", Cores: 64, MemoryGiB: 512,
					Disks: []Disk{{Name: "nvme1n1", Model: "Samsung PM9A3", SizeGiB: 1788}, {Name: "nvme0n1", Model: "Samsung PM9A3", Serial: "S64F", SizeGiB: 1788}},
					NICs: []NIC{{Name: "eno2", MAC: "52:54:00:01:00:11"}, {Name: "eno1", MAC: "52:54:00:01:00:01", SpeedMbps: 25000,
						LLDP: &state.LLDP{ChassisID: "0c:29:ef:00:00:01", SystemName: "leaf-r1-a", PortID: "0c:29:ef:00:00:07", PortIDSubtype: "mac", PortDescription: "Ethernet1/7", PortVLAN: 100, VLANs: []int{100, 200}, MaxFrameSize: 9216}}}},
				Conditions:      []Condition{{Type: "Ready", Status: "True", Reason: "Commissioned", LastTransitionTime: t0}},
				ObservedActions: inventory.Actions{Commission: 2, PowerCycle: 1},
			},
			{
				Name: "r2-n01", Lifecycle: "failed", Power: "unknown", Health: "Critical",
				Conditions: []Condition{{Type: "Stalled", Status: "True", Reason: "BMCUnreachable", Message: "dial tcp 10.10.2.11:443: i/o timeout", LastTransitionTime: t0}},
				LastError:  "redfish: get /redfish/v1/Systems/1: dial tcp 10.10.2.11:443: i/o timeout | retry later",
			},
		},
		Images: []ImageStatus{
			{Name: "ubuntu-24.04", State: "ready", Checksum: "sha256:0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0", SizeBytes: 3758096384},
			{Name: "debian-12", State: "failed", Message: "checksum mismatch"},
		},
		Hosts: []HostStatus{{Name: "hv-r1-n01", Server: "r1-n01", Site: "lab1", Rack: "r1", Tags: []string{"kvm", "nvme"}, State: "joined",
			Networks: []string{"prov", "mgmt"}, StoragePools: []string{"vms"}}},
	}
}

func TestRenderGolden(t *testing.T) {
	files, errs := renderStatus(sampleSnapshot(), 10, nil)
	if len(errs) != 0 {
		t.Fatalf("render errors: %v", errs)
	}
	var paths []string
	for _, f := range files {
		paths = append(paths, f.path)
		// Server files' goldens sit flat (servers/NAME.yaml.golden) for the
		// other packages' tests that read them; the fan-out folder is
		// checked by the paths below.
		rel := strings.TrimPrefix(f.path, "status/")
		if name, ok := serverNameOf(f.path); ok {
			rel = "servers/" + name + ".yaml"
		}
		golden := filepath.Join("testdata", "status", rel+".golden")
		if *update {
			if err := os.MkdirAll(filepath.Dir(golden), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(golden, f.data, 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		want, err := os.ReadFile(golden)
		if err != nil {
			t.Fatalf("%v (run with -update)", err)
		}
		if diff := cmp.Diff(string(want), string(f.data)); diff != "" {
			t.Errorf("renderStatus %s (-golden +got):\n%s", f.path, diff)
		}
	}
	want := []string{"status/README.md", "status/hosts/hv-r1-n01.yaml", "status/images/debian-12.yaml", "status/images/ubuntu-24.04.yaml",
		"status/inventory.yaml", "status/servers/59/r1-n01.yaml", "status/servers/63/r2-n01.yaml", "status/servers/b7/r1-n02.yaml"}
	if diff := cmp.Diff(want, paths); diff != "" {
		t.Errorf("rendered paths (-want +got):\n%s", diff)
	}
}

// TestRenderParsesAsYAML checks every rendered YAML file parses back to the
// values it was rendered from.
func TestRenderParsesAsYAML(t *testing.T) {
	files, _ := renderStatus(sampleSnapshot(), 10, nil)
	for _, f := range files {
		if !strings.HasSuffix(f.path, ".yaml") {
			continue
		}
		var v map[string]any
		if err := yamlUnmarshal(f.data, &v); err != nil {
			t.Errorf("%s does not parse: %v\n%s", f.path, err, f.data)
		}
		if f.path == ServerStatusPath("r1-n01") {
			hw := v["hardware"].(map[string]any)
			if hw["vendor"] != "Dell Inc." || hw["cores"] != 64 {
				t.Errorf("r1-n01 hardware parsed = %v", hw)
			}
			nics := hw["nics"].([]any)
			if nics[0].(map[string]any)["mac"] != "52:54:00:01:00:01" {
				t.Errorf("MAC parsed as %v, want the string", nics[0])
			}
		}
	}
}

func TestYAMLScalar(t *testing.T) {
	for in, want := range map[string]string{
		"r1-n01": "r1-n01", "ready": "ready", "powered_on": "powered_on", "yes": `"yes"`, "On": `"On"`, "True": `"True"`,
		"null": `"null"`, "1e3": `"1e3"`, "0x1F": `"0x1F"`, "12": `"12"`, "52:54:00:01:00:01": `"52:54:00:01:00:01"`,
		"a b": `"a b"`, "-x": `"-x"`, "": `""`, "a\nb": `"a\nb"`, "ubuntu-24.04": "ubuntu-24.04", ".inf": `".inf"`, "#c": `"#c"`,
	} {
		if got := yamlScalar(in); got != want {
			t.Errorf("yamlScalar(%q) = %s, want %s", in, got, want)
		}
	}
}

func TestRenderDeterministic(t *testing.T) {
	a, _ := renderStatus(sampleSnapshot(), 10, nil)
	s := sampleSnapshot()
	rng := rand.New(rand.NewPCG(1, 2))
	rng.Shuffle(len(s.Servers), func(i, j int) { s.Servers[i], s.Servers[j] = s.Servers[j], s.Servers[i] })
	rng.Shuffle(len(s.Images), func(i, j int) { s.Images[i], s.Images[j] = s.Images[j], s.Images[i] })
	for i := range s.Servers {
		slices.Reverse(s.Servers[i].Conditions)
		slices.Reverse(s.Servers[i].Events)
		slices.Reverse(s.Servers[i].Hardware.Disks)
	}
	slices.Reverse(s.Inventory.Invalid.Errors)
	b, _ := renderStatus(s, 10, nil)
	if diff := cmp.Diff(a, b, cmp.AllowUnexported(statusFile{})); diff != "" {
		t.Errorf("render depends on input order (-first +second):\n%s", diff)
	}
}

func TestRenderSkipsBadNames(t *testing.T) {
	s := Snapshot{Servers: []ServerStatus{{Name: "../../etc/passwd"}, {Name: "ok"}, {Name: "ok"}, {Name: ""}}}
	files, errs := renderStatus(s, 10, nil)
	if len(errs) != 3 {
		t.Errorf("errors = %v, want 3 (bad name, duplicate, empty)", errs)
	}
	for _, f := range files {
		if strings.Contains(f.path, "..") || strings.Contains(f.path, "passwd") {
			t.Errorf("rendered path %s", f.path)
		}
	}
}

const secret = "hunter2-SECRET"

// secretSnapshot puts a password-like string everywhere free text goes.
func secretSnapshot() Snapshot {
	s := sampleSnapshot()
	s.Servers[0].LastError = "redfish: get https://admin:" + secret + "@10.10.1.12/redfish/v1: 401"
	s.Servers[1].LastError = "ipmitool failed: password=" + secret + " user=admin"
	s.Servers[2].LastError = `login {"Password": "x", "token": "` + secret + `"}`
	s.Servers[0].Conditions[0].Message = "auth failed, token: " + secret
	s.Servers[1].Events = []StatusEvent{{Time: t0, Type: "Warning", Reason: "AuthFailed", Message: "Authorization: Bearer " + secret}}
	s.Servers[2].Hardware.Serial = "passwd=" + secret
	s.Images[0].Message = "download http://mirror/img?api_key=" + secret + "&x=1 failed"
	s.Hosts[0].Message = "join: secret='" + secret + "'"
	s.Inventory.Invalid.Errors[0].Msg = "bad value https://u:" + secret + "@h/x"
	return s
}

func TestRenderRedactsSecrets(t *testing.T) {
	files, _ := renderStatus(secretSnapshot(), 10, nil)
	for _, f := range files {
		if strings.Contains(string(f.data), "hunter2") {
			t.Errorf("%s leaks the secret:\n%s", f.path, f.data)
		}
	}
	// Redaction keeps the rest readable.
	for in, want := range map[string]string{
		"https://admin:" + secret + "@10.0.0.1/x":   "https://admin:***@10.0.0.1/x",
		"password=" + secret + " user=admin":        "password=*** user=admin",
		"Token: " + secret:                          "Token: ***",
		`"token": "` + secret + `"`:                 `"token": ***`,
		"Authorization: Basic dXNlcjpwYXNzd29yZA==": "Authorization: ***",
		"curl -H 'Bearer abcdefgh12'":               "curl -H '*** ***'",
		"dial tcp 10.0.0.1:443: i/o timeout":        "dial tcp 10.0.0.1:443: i/o timeout",
		"credentials: bmc-default":                  "credentials: bmc-default",
	} {
		got := redact.String(in)
		if strings.Contains(got, secret) || strings.Contains(got, "dXNlcjpwYXNzd29yZA") || strings.Contains(got, "abcdefgh12") {
			t.Errorf("redact.String(%q) = %q leaks", in, got)
		}
		if in == "dial tcp 10.0.0.1:443: i/o timeout" || in == "credentials: bmc-default" || in == "password="+secret+" user=admin" || strings.HasPrefix(in, "https://") {
			if got != want {
				t.Errorf("redact.String(%q) = %q, want %q", in, got, want)
			}
		}
	}
}

func newTestWriter(t *testing.T, r *testRepo, mod func(*StatusConfig)) *StatusWriter {
	t.Helper()
	cfg := StatusConfig{Remote: Remote{URL: r.url()}, StateDir: t.TempDir(), RetryDelay: time.Millisecond, Logger: testLogger(t)}
	if mod != nil {
		mod(&cfg)
	}
	w, err := NewStatusWriter(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// changedPaths lists the paths that differ between a commit and its first
// parent.
func changedPaths(t *testing.T, c *object.Commit) []string {
	t.Helper()
	tree, err := c.Tree()
	if err != nil {
		t.Fatal(err)
	}
	var ptree *object.Tree
	if c.NumParents() > 0 {
		p, err := c.Parent(0)
		if err != nil {
			t.Fatal(err)
		}
		if ptree, err = p.Tree(); err != nil {
			t.Fatal(err)
		}
	}
	changes, err := object.DiffTree(ptree, tree)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, ch := range changes {
		name := ch.To.Name
		if name == "" {
			name = ch.From.Name
		}
		out = append(out, name)
	}
	slices.Sort(out)
	return out
}

func TestStatusWriteCommit(t *testing.T) {
	r := newTestRepo(t)
	seed := r.remoteHead("main")
	w := newTestWriter(t, r, nil)
	s := sampleSnapshot()
	s.Servers[0].Lifecycle = "new"
	res, err := w.Write(t.Context(), s)
	if err != nil {
		t.Fatal(err)
	}
	c := r.remoteCommit(r.remoteHead("main"))
	if res.Commit != c.Hash.String() || c.NumParents() != 1 || c.ParentHashes[0] != seed {
		t.Fatalf("remote main = %s (parents %v), want status commit %s on %s", c.Hash, c.ParentHashes, res.Commit, seed)
	}
	if c.Author.Name != BotName || c.Author.Email != BotEmail || c.Committer.Email != BotEmail {
		t.Errorf("author = %v, committer = %v", c.Author, c.Committer)
	}
	for _, p := range changedPaths(t, c) {
		if !strings.HasPrefix(p, "status/") {
			t.Errorf("status commit changes %s", p)
		}
	}
	wantTrailers := "\n\n" + TrailerRevision + ": " + s.Inventory.Good.Commit + "\n" + TrailerDigest + ": " + s.Inventory.Good.Digest + "\n"
	if !strings.HasSuffix(c.Message, wantTrailers) {
		t.Errorf("message %q lacks trailers %q", c.Message, wantTrailers)
	}
	if got := firstLine(c.Message); got != "status: r1-n01 ready, r1-n02 new, r2-n01 failed" {
		t.Errorf("first subject = %q", got)
	}
	// The same snapshot again: no commit.
	res2, err := w.Write(t.Context(), s)
	if err != nil || res2.Commit != "" {
		t.Errorf("second Write = %+v, %v; want no commit", res2, err)
	}
	// Transitions.
	s.Servers[0].Lifecycle = "commissioning"
	s.Servers[1].Lifecycle = "allocated"
	res3, err := w.Write(t.Context(), s)
	if err != nil {
		t.Fatal(err)
	}
	if got := firstLine(res3.Message); got != "status: r1-n01 ready→allocated, r1-n02 new→commissioning" {
		t.Errorf("subject = %q", got)
	}
	// A fresh writer (controller restart) reads the old lifecycles from Git.
	w2 := newTestWriter(t, r, nil)
	s.Servers[1].Lifecycle = "deploying"
	res4, err := w2.Write(t.Context(), s)
	if err != nil {
		t.Fatal(err)
	}
	if got := firstLine(res4.Message); got != "status: r1-n01 allocated→deploying" {
		t.Errorf("subject after restart = %q", got)
	}
	// A server leaving the snapshot loses its file.
	s.Servers = s.Servers[:2]
	res5, err := w2.Write(t.Context(), s)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(res5.Message, "r2-n01 removed") {
		t.Errorf("message = %q, want r2-n01 removed", res5.Message)
	}
	if h := w2.Health(); h.Failing || h.LastCommit != res5.Commit || h.LastSuccess.IsZero() {
		t.Errorf("Health = %+v", h)
	}
}

// TestStatusCommitIsNoRevision: status commits never make a new revision.
func TestStatusCommitIsNoRevision(t *testing.T) {
	r := newTestRepo(t)
	var ev eventLog
	src := newTestSource(t, r, "", &ev)
	mustPoll(t, src)
	good, _ := src.Latest()
	w := newTestWriter(t, r, nil)
	if _, err := w.Write(t.Context(), sampleSnapshot()); err != nil {
		t.Fatal(err)
	}
	mustPoll(t, src)
	if got, inv := src.Latest(); got.Commit != good.Commit || inv != nil || len(ev.evs) != 1 {
		t.Errorf("after status commit: Latest %s invalid %v events %v; want unchanged", got.Commit, inv, ev.kinds())
	}
}

func TestSummarise(t *testing.T) {
	var items []string
	for i := range 500 {
		items = append(items, fmt.Sprintf("r%d-n%02d commissioning→ready", i/40+1, i%40+1))
	}
	got := summarise("status: ", items, 80)
	if utf8.RuneCountInString(got) > 80 || !strings.HasSuffix(got, " (+498 more)") {
		t.Errorf("summarise(500) = %q", got)
	}
	if got := summarise("status: ", items[:1], 72); got != "status: r1-n01 commissioning→ready" {
		t.Errorf("summarise(1) = %q", got)
	}
}

func TestStatusConcurrentPush(t *testing.T) {
	r := newTestRepo(t)
	w := newTestWriter(t, r, nil)
	var human plumbing.Hash
	w.beforePush = func(attempt int) {
		if attempt != 1 {
			return
		}
		// An operator pushes between the writer's fetch and its push,
		// including a (forbidden) hand edit of status/.
		r.pull()
		human = r.commit("operator change", map[string]string{
			"servers.yaml":               strings.Replace(r.read("servers.yaml"), "commission: 0", "commission: 5", 1),
			"status/servers/r9-n99.yaml": "hand-written\n",
		})
		r.push(false)
	}
	res, err := w.Write(t.Context(), sampleSnapshot())
	if err != nil {
		t.Fatal(err)
	}
	if res.Attempts != 2 {
		t.Errorf("attempts = %d, want 2 (rejected, then re-rendered)", res.Attempts)
	}
	tip := r.remoteCommit(r.remoteHead("main"))
	if tip.Hash.String() != res.Commit || tip.NumParents() != 1 || tip.ParentHashes[0] != human {
		t.Fatalf("remote tip %s parents %v; want the status commit on top of the operator's %s", tip.Hash, tip.ParentHashes, human)
	}
	for _, p := range changedPaths(t, tip) {
		if !strings.HasPrefix(p, "status/") {
			t.Errorf("status commit changes %s", p)
		}
	}
	// The operator's inventory change survives; the hand edit of status is replaced.
	f, err := tip.File("servers.yaml")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := f.Contents()
	if !strings.Contains(body, "commission: 5") {
		t.Error("the operator's change was lost")
	}
	if _, err := tip.File("status/servers/r9-n99.yaml"); err == nil {
		t.Error("hand-written status file survived the re-render")
	}
}

// TestStatusConcurrentWriters races two writers (two controllers, or a
// controller and a human) on the same branch: every commit survives.
func TestStatusConcurrentWriters(t *testing.T) {
	r := newTestRepo(t)
	w1 := newTestWriter(t, r, func(c *StatusConfig) { c.Attempts = 20 })
	w2 := newTestWriter(t, r, func(c *StatusConfig) { c.Attempts = 20 })
	errs := make(chan error, 2)
	commits := make(chan string, 20)
	for i, w := range []*StatusWriter{w1, w2} {
		go func() {
			for n := range 5 {
				s := sampleSnapshot()
				s.Servers[0].LastError = fmt.Sprintf("writer %d round %d", i, n)
				res, err := w.Write(t.Context(), s)
				if err != nil {
					errs <- err
					return
				}
				commits <- res.Commit
			}
			errs <- nil
		}()
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	close(commits)
	tip := r.remoteCommit(r.remoteHead("main"))
	reach := map[string]bool{}
	iter := object.NewCommitPreorderIter(tip, nil, nil)
	iter.ForEach(func(c *object.Commit) error { reach[c.Hash.String()] = true; return nil })
	n := 0
	for c := range commits {
		if c == "" {
			continue
		}
		n++
		if !reach[c] {
			t.Errorf("status commit %s lost", c)
		}
	}
	if n < 2 {
		t.Errorf("only %d commits made", n)
	}
}

func TestStatusWriteFailing(t *testing.T) {
	r := newTestRepo(t)
	w := newTestWriter(t, r, func(c *StatusConfig) {
		c.Remote.URL = "file://" + filepath.Join(t.TempDir(), "missing.git")
		c.Attempts = 2
		c.FailingAfter = 3
	})
	for i := 1; i <= 3; i++ {
		if _, err := w.Write(t.Context(), sampleSnapshot()); err == nil {
			t.Fatal("Write to a missing remote succeeded")
		}
		if h := w.Health(); h.ConsecutiveFailures != i || h.Failing != (i >= 3) || h.LastError == "" {
			t.Errorf("after %d failures Health = %+v", i, h)
		}
	}
}

func TestStatusBranch(t *testing.T) {
	r := newTestRepo(t)
	main := r.remoteHead("main")
	w := newTestWriter(t, r, func(c *StatusConfig) { c.StatusBranch = "machina-status" })
	res, err := w.Write(t.Context(), sampleSnapshot())
	if err != nil {
		t.Fatal(err)
	}
	if r.remoteHead("main") != main {
		t.Error("main moved although status goes to its own branch")
	}
	c := r.remoteCommit(r.remoteHead("machina-status"))
	if c.Hash.String() != res.Commit || c.NumParents() != 0 {
		t.Errorf("status branch = %s parents %d, want orphan %s", c.Hash, c.NumParents(), res.Commit)
	}
	tree, _ := c.Tree()
	if len(tree.Entries) != 1 || tree.Entries[0].Name != "status" {
		t.Errorf("status branch tree = %v, want only status/", tree.Entries)
	}
	s := sampleSnapshot()
	s.Servers[0].Lifecycle = "ready"
	res2, err := w.Write(t.Context(), s)
	if err != nil {
		t.Fatal(err)
	}
	c2 := r.remoteCommit(r.remoteHead("machina-status"))
	if c2.Hash.String() != res2.Commit || c2.NumParents() != 1 || c2.ParentHashes[0] != c.Hash {
		t.Errorf("second status commit %s parents %v", c2.Hash, c2.ParentHashes)
	}
	if _, err := NewStatusWriter(StatusConfig{Remote: Remote{URL: r.url()}, StateDir: t.TempDir(), StatusBranch: "../x"}); !errors.Is(err, ErrRemoteConfig) {
		t.Errorf("bad StatusBranch = %v", err)
	}
}

// TestStatusWriteNoSecretInGit writes the secret snapshot and scans every
// blob and the message of the pushed commit.
func TestStatusWriteNoSecretInGit(t *testing.T) {
	r := newTestRepo(t)
	w := newTestWriter(t, r, nil)
	res, err := w.Write(t.Context(), secretSnapshot())
	if err != nil {
		t.Fatal(err)
	}
	c := r.remoteCommit(plumbing.NewHash(res.Commit))
	if strings.Contains(c.Message, "hunter2") {
		t.Errorf("commit message leaks: %s", c.Message)
	}
	files, err := c.Files()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	files.ForEach(func(f *object.File) error {
		rd, err := f.Reader()
		if err != nil {
			return err
		}
		defer rd.Close()
		b, _ := io.ReadAll(rd)
		if strings.Contains(string(b), "hunter2") {
			t.Errorf("%s in Git leaks the secret", f.Name)
		}
		n++
		return nil
	})
	if n < 8 {
		t.Errorf("scanned %d files", n)
	}
}

func TestOnlyStatusChanged(t *testing.T) {
	h := func(s string) plumbing.Hash { return plumbing.ComputeHash(plumbing.BlobObject, []byte(s)) }
	base := &object.Tree{Entries: []object.TreeEntry{{Name: "servers.yaml", Mode: 0o100644, Hash: h("a")}, {Name: "status", Mode: 0o40000, Hash: h("s")}}}
	ok := &object.Tree{Entries: []object.TreeEntry{{Name: "servers.yaml", Mode: 0o100644, Hash: h("a")}, {Name: "status", Mode: 0o40000, Hash: h("t")}}}
	bad := &object.Tree{Entries: []object.TreeEntry{{Name: "servers.yaml", Mode: 0o100644, Hash: h("b")}, {Name: "status", Mode: 0o40000, Hash: h("t")}}}
	extra := &object.Tree{Entries: append(slices.Clone(ok.Entries), object.TreeEntry{Name: "x", Mode: 0o100644, Hash: h("x")})}
	if err := onlyStatusChanged(base, ok); err != nil {
		t.Errorf("status-only change: %v", err)
	}
	for name, next := range map[string]*object.Tree{"edit": bad, "add": extra} {
		if err := onlyStatusChanged(base, next); !errors.Is(err, ErrOutsideStatus) {
			t.Errorf("%s outside status = %v, want ErrOutsideStatus", name, err)
		}
	}
}

// TestStatusCloneCompaction: the writer's clone is rebuilt once it holds
// too many packfiles, and writing goes on correctly.
func TestStatusCloneCompaction(t *testing.T) {
	r := newTestRepo(t)
	w := newTestWriter(t, r, nil)
	w.maxPacks = 3
	s := sampleSnapshot()
	var last string
	for i := range 8 {
		s.Servers[0].LastError = fmt.Sprintf("round %d", i)
		res, err := w.Write(t.Context(), s)
		if err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
		if res.Commit == "" {
			t.Fatalf("round %d: no commit", i)
		}
		if i > 0 && r.remoteCommit(plumbing.NewHash(res.Commit)).ParentHashes[0].String() != last {
			t.Fatalf("round %d: commit not on top of the previous one", i)
		}
		last = res.Commit
		packs, err := w.repo.Storer.(interface {
			ObjectPacks() ([]plumbing.Hash, error)
		}).ObjectPacks()
		if err != nil {
			t.Fatal(err)
		}
		if len(packs) > 4 {
			t.Fatalf("round %d: %d packs, want at most maxPacks+1", i, len(packs))
		}
	}
}

// TestInvalidRevisionReachesStatus: an invalid commit's errors, with
// file:line, land in status/inventory.yaml while the good revision stays.
func TestInvalidRevisionReachesStatus(t *testing.T) {
	r := newTestRepo(t)
	state := t.TempDir()
	src, err := NewSource(SourceConfig{Remote: Remote{URL: r.url()}, StateDir: state, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	w, err := NewStatusWriter(StatusConfig{Remote: Remote{URL: r.url()}, StateDir: state, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	mustPoll(t, src)
	good, _ := src.Latest()
	r.edit("servers.yaml", `bootMAC: "52:54:00:01:00:03"`, `bootMAC: "52:54:00:01:00:01"`, "duplicate MAC")
	r.push(false)
	mustPoll(t, src)
	_, inv := src.Latest()
	if inv == nil {
		t.Fatal("duplicate MAC not reported")
	}
	res, err := w.Write(t.Context(), Snapshot{Inventory: src.InventoryStatus()})
	if err != nil {
		t.Fatal(err)
	}
	if want := "status: inventory invalid at " + inv.Commit[:12]; firstLine(res.Message) != want {
		t.Errorf("subject = %q, want %q", firstLine(res.Message), want)
	}
	if !strings.Contains(res.Message, TrailerRevision+": "+good.Commit) {
		t.Errorf("trailer does not name the good revision: %s", res.Message)
	}
	f, err := r.remoteCommit(plumbing.NewHash(res.Commit)).File("status/inventory.yaml")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := f.Contents()
	var doc struct {
		Valid    bool
		ActingOn struct{ Commit, Digest string } `yaml:"actingOn"`
		Newest   struct {
			Commit string
			Errors []struct {
				File    string
				Line    int
				Message string
			}
		} `yaml:"newestInvalid"`
	}
	if err := yamlUnmarshal([]byte(body), &doc); err != nil {
		t.Fatal(err)
	}
	if doc.Valid || doc.ActingOn.Commit != good.Commit || doc.Newest.Commit != inv.Commit || len(doc.Newest.Errors) == 0 {
		t.Fatalf("status/inventory.yaml = %+v", doc)
	}
	e := doc.Newest.Errors[0]
	if e.File != "servers.yaml" || e.Line != inv.Errors[0].Line || e.Line == 0 {
		t.Errorf("first error %+v, want servers.yaml:%d", e, inv.Errors[0].Line)
	}
	// The status commit itself is no new revision, and the invalid one stays reported.
	mustPoll(t, src)
	if g, inv2 := src.Latest(); g.Commit != good.Commit || inv2 == nil {
		t.Errorf("after status commit: good %s, invalid %v", g.Commit, inv2)
	}
}

// TestStatusLocalPack: the pack the writer builds by hand (and pushes) is
// valid for the real git (verify-pack, fsck of both repositories) and is
// read back by go-git from the writer's clone without a fetch.
func TestStatusLocalPack(t *testing.T) {
	r := newTestRepo(t)
	state := t.TempDir()
	w := newTestWriter(t, r, func(c *StatusConfig) { c.StateDir = state })
	s := bigSnapshot(300, "ready")
	res, err := w.Write(t.Context(), s)
	if err != nil {
		t.Fatal(err)
	}
	c, err := w.repo.CommitObject(plumbing.NewHash(res.Commit))
	if err != nil {
		t.Fatalf("status commit not in the local clone: %v", err)
	}
	f, err := c.File(ServerStatusPath("r000-n01"))
	if err != nil {
		t.Fatal(err)
	}
	if body, _ := f.Contents(); !strings.Contains(body, "lifecycle: ready") {
		t.Errorf("local blob = %q", body)
	}
	packs, err := filepath.Glob(filepath.Join(state, "status.git", "objects", "pack", "*.pack"))
	if err != nil || len(packs) == 0 {
		t.Fatalf("packs = %v, %v", packs, err)
	}
	for _, p := range packs {
		if out, err := exec.Command("git", "verify-pack", p).CombinedOutput(); err != nil {
			t.Errorf("git verify-pack %s: %v\n%s", p, err, out)
		}
	}
	for _, dir := range []string{r.bare, filepath.Join(state, "status.git")} {
		if out, err := exec.Command("git", "-C", dir, "fsck", "--no-dangling").CombinedOutput(); err != nil {
			t.Errorf("git fsck %s: %v\n%s", dir, err, out)
		}
	}
	// The next write builds on the local copy of its own commit: it adds
	// exactly one pack (its own), no fetched one.
	s.Servers[0].Lifecycle = "commissioning"
	res2, err := w.Write(t.Context(), s)
	if err != nil {
		t.Fatal(err)
	}
	if firstLine(res2.Message) != "status: r000-n00 ready→commissioning" {
		t.Errorf("subject = %q", firstLine(res2.Message))
	}
	packs2, _ := filepath.Glob(filepath.Join(state, "status.git", "objects", "pack", "*.pack"))
	if len(packs2) != len(packs)+1 {
		t.Errorf("packs %d → %d, want one more (no fetch)", len(packs), len(packs2))
	}
}

// TestReadmeShowsHeldPlan: a plan held by the safety brake is said on
// status/README.md, the page the demo points people to, not only in
// inventory.yaml; the reason is made safe for Markdown.
func TestReadmeShowsHeldPlan(t *testing.T) {
	s := sampleSnapshot()
	s.Inventory.Invalid = nil
	s.Inventory.Held = &HeldPlan{Reason: "held until approved (machinactl approve c4c0915ede48): releases 2 of 3 | <b>", Steps: []string{"r1-n01 release: x", "r1-n02 release: y"}}
	files, _ := renderStatus(s, 10, nil)
	for _, f := range files {
		if f.path != "status/README.md" {
			continue
		}
		want := "**Plan held by the safety brake**: held until approved (machinactl approve c4c0915ede48): releases 2 of 3 \\| &lt;b&gt;. 2 steps wait for approval"
		if !strings.Contains(string(f.data), want) {
			t.Errorf("README.md lacks %q:\n%s", want, f.data)
		}
		// One held step: singular.
		s.Inventory.Held.Steps = s.Inventory.Held.Steps[:1]
		one, _ := renderStatus(s, 10, nil)
		for _, f := range one {
			if f.path == "status/README.md" && !strings.Contains(string(f.data), ". 1 step waits for approval") {
				t.Errorf("README.md with one held step:\n%s", f.data)
			}
		}
		return
	}
	t.Fatal("no status/README.md rendered")
}

// TestStatusSubjects checks the subjects of status commits that change no
// server: the first one before any inventory revision names that (it was
// "status: inventory revision " with nothing after it), then one with a
// revision names its short commit, and one updated entry is "1 entry"
// (it was "update 1 entries"), two are "2 entries".
func TestStatusSubjects(t *testing.T) {
	r := newTestRepo(t)
	w := newTestWriter(t, r, nil)
	s := Snapshot{Images: []ImageStatus{{Name: "ubuntu-24.04", State: "downloading"}}}
	write := func(want string) {
		t.Helper()
		res, err := w.Write(t.Context(), s)
		if err != nil {
			t.Fatal(err)
		}
		if got := firstLine(res.Message); got != want {
			t.Errorf("subject = %q, want %q\n%s", got, want, res.Message)
		}
	}
	write("status: no inventory revision yet")
	s.Inventory.Good = RevisionRef{Commit: "0123456789abcdef0123456789abcdef01234567", Digest: "sha256:aabbccddeeff00112233445566778899aabbccddeeff00112233445566778899"}
	write("status: inventory revision 0123456789ab")
	s.Images[0].State = "ready"
	write("status: update 1 entry")
	s.Images[0].State = "failed"
	s.Hosts = []HostStatus{{Name: "hv-r1-n01", State: "joined"}}
	write("status: update 2 entries")
}
