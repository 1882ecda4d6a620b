package sim_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/machina-metal/machina/controller"
	"github.com/machina-metal/machina/internal/etcdtest"
	"github.com/machina-metal/machina/internal/peertest"
	"github.com/machina-metal/machina/lab/sim"
	"github.com/machina-metal/machina/reconciler/plan"
	"github.com/machina-metal/machina/state"
)

// TestShardedGroups runs a sharded site (docs/ha.md "Sharding") on a
// 3-member etcd over the simulated lab: group east (zone-a) and group
// west (zone-b, zone-c), one controller each, on one inventory
// repository and one etcd prefix. Each group is elected under its own key
// (PREFIX groups/GROUP/leader) and records its zone claim; each deploys
// its own profiles' counts (east 2 hypervisors in zone-a, west 1 storage
// in zone-b) through its own machine-facing URL (each group's
// provisioning network: a dispatcher sends a machine's first iPXE request
// to its zone's group, as DHCP on separate networks would); status lands
// under status/east/ and status/west/, each folder holding only its
// group's servers, both writers healthy and `git fsck` of the repository
// clean. Then a third group north claims zone-c too: both west's and
// north's plans refuse zone-c's servers with a ZoneClaimConflict
// condition naming both groups, and neither acts on them.
func TestShardedGroups(t *testing.T) {
	gitBin := peertest.Command(t, "git")
	cl := etcdtest.Start(t, etcdtest.Options{Members: 3})
	dir := t.TempDir()
	log := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelInfo}))
	labCtx, labCancel := context.WithCancel(context.Background())
	lab, err := sim.Start(labCtx, sim.Config{Dir: filepath.Join(dir, "lab"), RedfishOnly: true, Logger: log.With("lab", "sim")})
	if err != nil {
		labCancel()
		t.Fatal(err)
	}
	t.Cleanup(func() { labCancel(); lab.Close() })
	ops, err := state.OpenEtcd(state.EtcdConfig{Client: cl.Client(t), Prefix: "/site/"}, state.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer ops.Close()
	user, pass := lab.Credentials()
	for _, name := range []string{"bmc-redfish", "bmc-ipmi"} {
		if _, err := ops.PutSecret(name, state.Credential{Username: user, Password: pass}, "test"); err != nil {
			t.Fatalf("put secret: %v", err)
		}
	}

	// Each group's machine-facing URL; the dispatcher stands for the
	// provisioning networks' DHCP pointing each machine at its group.
	groupOf := map[string]string{}
	for _, m := range lab.Machines() {
		groupOf[strings.ToLower(m.MAC)] = map[string]string{"r1": "east", "r2": "west", "r3": "west"}[m.Name[:2]]
	}
	vips := map[string]*vipProxy{"east": newVIPProxy(t), "west": newVIPProxy(t)}
	disp := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		v, ok := vips[groupOf[strings.ToLower(r.URL.Query().Get("mac"))]]
		if !ok {
			http.Error(w, "no group for this MAC", http.StatusNotFound)
			return
		}
		http.Redirect(w, r, v.srv.URL+r.URL.RequestURI(), http.StatusTemporaryRedirect)
	}))
	t.Cleanup(disp.Close)
	lab.SetController(disp.URL)
	group := func(name string, zones ...string) func(*controller.Config) {
		return func(c *controller.Config) { c.Group, c.Zones = name, zones }
	}
	east := startHANode(t, lab, dir, "east-1", vips["east"].srv.URL, cl.Endpoints(), log, group("east", "zone-a"))
	west := startHANode(t, lab, dir, "west-1", vips["west"].srv.URL, cl.Endpoints(), log, group("west", "zone-b", "zone-c"))
	waitUntil(t, "both groups' leaders elected", 10*time.Second, func() bool { return east.run.Elector.IsLeader() && west.run.Elector.IsLeader() })
	vips["east"].move(t, east.addr())
	vips["west"].move(t, west.addr())
	for _, g := range []string{"east", "west"} {
		resp, err := cl.Client(t).Get(context.Background(), "/site/groups/"+g+"/leader/", clientv3.WithPrefix())
		if err != nil || len(resp.Kvs) != 1 {
			t.Fatalf("group %s election keys: %v, %v; want one under /site/groups/%s/leader/", g, resp, err, g)
		}
	}

	h := &harness{t: t, lab: lab, run: east.run}
	h.waitFor("east's and west's counts deployed", 3*time.Minute, func(s state.Snapshot) bool {
		perZone := map[string]int{}
		for _, srv := range s.Servers {
			switch srv.Lifecycle {
			case state.LifecycleDeployed:
				perZone[srv.Zone]++
			case state.LifecycleReady:
			case state.LifecycleNew:
				if srv.Name != "r3-n03" {
					return false
				}
			default:
				return false
			}
			if srv.InFlight != nil {
				return false
			}
		}
		return len(s.Servers) == 12 && perZone["zone-a"] == 2 && perZone["zone-b"] == 1 && len(perZone) == 2
	})
	claims, err := ops.ZoneClaimMap()
	if err != nil || strings.Join(claims["east"], ",") != "zone-a" || strings.Join(claims["west"], ",") != "zone-b,zone-c" {
		t.Fatalf("zone claims = %v, %v", claims, err)
	}

	repo := strings.TrimPrefix(lab.RepoURL, "file://")
	files := func() []string {
		out, err := exec.Command(gitBin, "-C", repo, "ls-tree", "-r", "--name-only", "main", "status/").Output()
		if err != nil {
			t.Fatalf("git ls-tree: %v", err)
		}
		return strings.Fields(string(out))
	}
	waitUntil(t, "both groups' status files", time.Minute, func() bool {
		var e, w int
		for _, f := range files() {
			if strings.HasPrefix(f, "status/east/servers/") {
				e++
			}
			if strings.HasPrefix(f, "status/west/servers/") {
				w++
			}
		}
		return e == 5 && w == 7
	})
	for _, f := range files() {
		g, rest, _ := strings.Cut(strings.TrimPrefix(f, "status/"), "/")
		if (g != "east" && g != "west") || rest == "" {
			t.Errorf("status file %s outside status/east/ and status/west/", f)
		}
		if name, ok := strings.CutPrefix(rest, "servers/"); ok && map[string]string{"r1": "east", "r2": "west", "r3": "west"}[path.Base(name)[:2]] != g {
			t.Errorf("%s: a server of another group's zones", f)
		}
	}
	for _, f := range []string{"status/east/README.md", "status/west/README.md"} {
		if !strings.Contains(strings.Join(files(), " "), f) {
			t.Errorf("%s missing", f)
		}
	}
	for _, n := range []*haNode{east, west} {
		if hl := n.run.Status.Health(); hl.Failing || hl.LastError != "" {
			t.Errorf("%s's status writer: %+v", n.id, hl)
		}
	}
	fsckQuiet(t, gitBin, repo)

	// A third group claims zone-c too: both plans refuse its servers.
	before, err := ops.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	vips["north"] = newVIPProxy(t)
	north := startHANode(t, lab, dir, "north-1", vips["north"].srv.URL, cl.Endpoints(), log, group("north", "zone-c"))
	waitUntil(t, "north elected", 10*time.Second, north.run.Elector.IsLeader)
	conflicts := func(r plan.Result) []plan.Condition {
		var out []plan.Condition
		for _, c := range r.Conditions {
			if c.Type == plan.CondZoneClaimConflict && strings.HasPrefix(c.Subject, "server/r3-") {
				out = append(out, c)
			}
		}
		return out
	}
	waitUntil(t, "west and north refusing zone-c", 30*time.Second, func() bool {
		return len(conflicts(west.run.Reconciler.LastPlan())) == 3 && len(conflicts(north.run.Reconciler.LastPlan())) == 3
	})
	for _, n := range []*haNode{west, north} {
		for _, c := range conflicts(n.run.Reconciler.LastPlan()) {
			if !strings.Contains(c.Message, "west") || !strings.Contains(c.Message, "north") {
				t.Errorf("%s: condition %q does not name both groups", n.id, c.Message)
			}
		}
		for _, st := range n.run.Reconciler.LastPlan().Steps {
			if strings.HasPrefix(st.Server, "r3-") {
				t.Errorf("%s plans %v on a contested server", n.id, st)
			}
		}
	}
	after, err := ops.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	for name, s := range after.Servers {
		if strings.HasPrefix(name, "r3-") && (s.Lifecycle != record(before, name).Lifecycle || s.InFlight != nil) {
			t.Errorf("contested %s moved: %s → %s", name, record(before, name).Lifecycle, s.Lifecycle)
		}
	}
}

// fsckQuiet runs git fsck --strict on repo while controllers may still
// push to it, and fails the test on an error from a run during which no
// ref moved. git fsck reads the object store first and the refs after it,
// so a push landing in between shows its commit as missing and its
// parent as dangling (CI of fd5568b: a status commit 20 ms before the
// fsck); such a run proves nothing either way and is repeated, up to five
// times.
func fsckQuiet(t *testing.T, gitBin, repo string) {
	t.Helper()
	refs := func() string {
		out, err := exec.Command(gitBin, "-C", repo, "for-each-ref", "--format=%(refname) %(objectname)").Output()
		if err != nil {
			t.Fatalf("git for-each-ref: %v", err)
		}
		return string(out)
	}
	for attempt := 1; ; attempt++ {
		before := refs()
		out, err := exec.Command(gitBin, "-C", repo, "fsck", "--strict").CombinedOutput()
		if err == nil {
			return
		}
		if moved := refs() != before; !moved || attempt == 5 {
			t.Fatalf("git fsck (attempt %d; refs moved during it: %v): %v\n%s", attempt, moved, err, out)
		}
		t.Logf("git fsck raced a push (refs moved during it), again: %v", err)
		time.Sleep(200 * time.Millisecond)
	}
}
