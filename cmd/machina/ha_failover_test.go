package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/ha"
	"github.com/machina-metal/machina/internal/etcdtest"
	"github.com/machina-metal/machina/internal/peertest"
	"github.com/machina-metal/machina/lab/sim"
	"github.com/machina-metal/machina/state"
)

// haServers and haKills are the failover test's size, the issue's: 100
// servers (sim's generated site keeps 10% of each zone deployed, 3 per
// profile, 9 in all) and 5 leader kills.
const (
	haServers = 100
	haKills   = 5
)

// haPerProfile is how many servers each of sim's three generated profiles
// keeps deployed at haServers (sim.generated: n/30, at least 1).
const haPerProfile = max(haServers/30, 1)

// leaderVIP stands in for the provisioning VIP: one URL for machines and
// the operator, forwarded to the admin URL in the current election value
// (read from etcd, as a standby reads it).
type leaderVIP struct {
	cli    *clientv3.Client
	prefix string
	mu     sync.Mutex
	cached *url.URL
	at     time.Time
}

func (v *leaderVIP) leader(ctx context.Context) (ha.Candidate, bool) {
	c, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	resp, err := v.cli.Get(c, v.prefix, clientv3.WithFirstCreate()...)
	if err != nil || len(resp.Kvs) == 0 {
		return ha.Candidate{}, false
	}
	var cand ha.Candidate
	if json.Unmarshal(resp.Kvs[0].Value, &cand) != nil {
		return ha.Candidate{}, false
	}
	return cand, true
}

func (v *leaderVIP) target(ctx context.Context) *url.URL {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.cached != nil && time.Since(v.at) < 200*time.Millisecond {
		return v.cached
	}
	cand, ok := v.leader(ctx)
	if !ok {
		v.cached = nil
		return nil
	}
	u, err := url.Parse(cand.AdminURL)
	if err != nil {
		return nil
	}
	v.cached, v.at = u, time.Now()
	return u
}

func (v *leaderVIP) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	u := v.target(r.Context())
	if u == nil {
		http.Error(w, "no leader holds the VIP", http.StatusServiceUnavailable)
		return
	}
	(&httputil.ReverseProxy{Rewrite: func(pr *httputil.ProxyRequest) { pr.SetURL(u); pr.Out.Host = pr.In.Host }}).ServeHTTP(w, r)
}

// TestHAFailoverKills runs two `machina serve` processes of one group on
// a 3-member etcd against a simulated lab of haServers servers and
// SIGKILLs the leader haKills times at random moments while servers
// commission and deploy (each kill 0.3-2 s after the fleet is seen in
// motion; a kill with nothing in flight within 2 min is an error),
// restarting each killed one as a standby. Every
// takeover must come within TTL plus a margin; the fleet must converge
// (every server ready or deployed, none failed, each profile's count
// deployed), no server deployed twice, and no BMC reset more often than
// the controller's journal entries that netboot it (transitions into
// commissioning and deploying, renetboot events) plus the reboot into the
// installed OS of each deploy: a resumed entry that reset again would
// exceed it. `git fsck --strict` of the inventory repository the leaders
// pushed status to must be clean.
func TestHAFailoverKills(t *testing.T) {
	peertest.Slow(t, "the HA failover test builds machina and runs two controllers over a simulated fleet")
	t0 := time.Now()
	dir := t.TempDir()
	bin := buildMachina(t, dir)

	cl := etcdtest.Start(t, etcdtest.Options{Members: 3})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	lab, err := sim.Start(ctx, sim.Config{Dir: filepath.Join(dir, "lab"), Servers: haServers, RedfishOnly: true, BootDelay: 3 * time.Second, ImageBytes: 8 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer lab.Close()

	ecli := cl.Client(t)
	ops, err := state.OpenEtcd(state.EtcdConfig{Client: ecli, Prefix: "/site/"}, state.Options{})
	if err != nil {
		t.Fatal(err)
	}
	adminTok := seedSimSite(t, ops, lab, "ha-test")
	_ = ops.Close()

	vip := &leaderVIP{cli: ecli, prefix: "/site/leader/"}
	vsrv := httptest.NewServer(vip)
	defer vsrv.Close()
	lab.SetController(vsrv.URL)
	client, err := v1.NewClient(vsrv.URL, adminTok)
	if err != nil {
		t.Fatal(err)
	}
	target := "etcd://" + strings.TrimPrefix(cl.Member(0).ClientURL, "http://")
	for _, m := range cl.Members()[1:] {
		target += "," + strings.TrimPrefix(m.ClientURL, "http://")
	}
	target += "/site"

	type proc struct {
		id   string
		port int
		*serveProc
		runs int
	}
	procs := map[string]*proc{"a": {id: "a", port: freePort(t)}, "b": {id: "b", port: freePort(t)}}
	start := func(p *proc) {
		p.runs++
		self := fmt.Sprintf("http://127.0.0.1:%d", p.port)
		args := append([]string{"serve", "--state", target, "--ha-id", p.id, "--ha-ttl", "2s", "--ha-admin-url", self,
			"--work-dir", filepath.Join(dir, "work-"+p.id), "--repo", lab.RepoURL,
			"--listen", fmt.Sprintf("127.0.0.1:%d", p.port), "--join-listen", fmt.Sprintf("127.0.0.1:%d", freePort(t)), "--public-url", vsrv.URL},
			fastServeFlags...)
		p.serveProc = startServe(t, bin, args, nil, filepath.Join(dir, fmt.Sprintf("%s-%02d.log", p.id, p.runs)))
	}
	start(procs["a"])
	start(procs["b"])
	waitLeader := func(not string, within time.Duration) (string, time.Duration) {
		t0 := time.Now()
		for time.Since(t0) < within {
			if c, ok := vip.leader(ctx); ok && c.ID != not {
				return c.ID, time.Since(t0)
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Fatalf("no leader other than %q within %s", not, within)
		return "", 0
	}
	leader, _ := waitLeader("", time.Minute)
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 20))
	for k := 1; k <= haKills; k++ {
		moving := false
		for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
			if moving = inMotion(ctx, client); moving {
				break
			}
		}
		if !moving {
			t.Errorf("kill %d: no server commissioning or deploying within 2 min; the kill would not land in flight", k)
		}
		time.Sleep(time.Duration(300+rng.IntN(1700)) * time.Millisecond)
		p := procs[leader]
		p.kill()
		next, gap := waitLeader(leader, 30*time.Second)
		t.Logf("kill %d: SIGKILLed leader %s; %s elected %s later; %s", k, leader, next, gap.Round(10*time.Millisecond), fleetSummary(ctx, client))
		// TTL 2 s, lessor granularity 0.5 s, campaign and scheduling on a busy machine.
		if gap > 2*time.Second+3*time.Second {
			t.Errorf("kill %d: takeover took %s, want within TTL + 3 s", k, gap)
		}
		start(p) // back as a standby
		leader = next
	}
	lastKill := time.Now()

	last := waitConverged(t, ctx, client, haServers, map[string]int{"hypervisor": haPerProfile, "storage": haPerProfile, "gpu": haPerProfile}, 4*time.Minute)
	t.Logf("converged %s after the last kill (%s in all): %s", time.Since(lastKill).Round(time.Second), time.Since(t0).Round(time.Second), last)

	// Deployed once each; resets within the journal's netboots.
	toDeployed, netboots := map[string]int{}, map[string]int{}
	walkEvents(t, ctx, client, func(ev v1.Event) {
		switch {
		case ev.Kind == string(state.EventTransition) && ev.To == "deployed":
			toDeployed[ev.Server]++
			netboots[ev.Server]++ // the reboot into the installed OS
		case ev.Kind == string(state.EventTransition) && (ev.To == "commissioning" || ev.To == "deploying"):
			netboots[ev.Server]++
		case ev.Kind == "machine.renetboot":
			netboots[ev.Server]++
		}
	})
	for name, n := range toDeployed {
		if n > 1 {
			t.Errorf("%s deployed %d times", name, n)
		}
	}
	if len(toDeployed) != 3*haPerProfile {
		t.Errorf("%d servers deployed, want %d", len(toDeployed), 3*haPerProfile)
	}
	over := 0
	for _, m := range lab.Machines() {
		resets := 0
		for _, q := range lab.BMC(m.Name).Requests() {
			if q.Method == http.MethodPost && strings.HasSuffix(q.Path, "ComputerSystem.Reset") && q.Status < 300 {
				resets++
			}
		}
		if resets > netboots[m.Name] {
			over++
			t.Errorf("%s: %d resets accepted by its BMC, more than its %d journalled netboots", m.Name, resets, netboots[m.Name])
		}
	}
	t.Logf("%d servers, %d with more resets than journalled netboots", len(lab.Machines()), over)

	// Status commits from five leaders, each killed mid-push at worst:
	// the inventory repository stays whole.
	gitBin := peertest.Command(t, "git")
	if out, err := exec.Command(gitBin, "-C", strings.TrimPrefix(lab.RepoURL, "file://"), "fsck", "--strict").CombinedOutput(); err != nil {
		t.Errorf("git fsck of the inventory repository: %v\n%s", err, out)
	}
}
