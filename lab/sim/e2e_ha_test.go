package sim_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/machina-metal/machina/controller"
	"github.com/machina-metal/machina/ha"
	"github.com/machina-metal/machina/internal/etcdtest"
	"github.com/machina-metal/machina/lab/sim"
	"github.com/machina-metal/machina/lab/sim/simtest"
	"github.com/machina-metal/machina/state"
)

// vipProxy stands in for the provisioning VIP in-process: one address the
// machines use, forwarded to whichever controller holds it.
type vipProxy struct {
	mu     sync.Mutex
	target *url.URL
	srv    *httptest.Server
}

func newVIPProxy(t *testing.T) *vipProxy {
	v := &vipProxy{}
	rp := &httputil.ReverseProxy{Rewrite: func(pr *httputil.ProxyRequest) {
		v.mu.Lock()
		tgt := v.target
		v.mu.Unlock()
		pr.SetURL(tgt)
		pr.Out.Host = pr.In.Host
	}}
	v.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		v.mu.Lock()
		ok := v.target != nil
		v.mu.Unlock()
		if !ok {
			http.Error(w, "no holder", http.StatusServiceUnavailable)
			return
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(v.srv.Close)
	return v
}

// move points the VIP at the controller listening at rawURL.
func (v *vipProxy) move(t *testing.T, rawURL string) {
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	v.mu.Lock()
	v.target = u
	v.mu.Unlock()
}

// haNode is one controller of the group under test.
type haNode struct {
	id  string
	run *controller.Running
	ctl *simtest.Controller
}

// startHANode starts controller id of a group; mods change its
// configuration (a sharded site's Group and Zones).
func startHANode(t *testing.T, lab *sim.Lab, dir, id, publicURL string, endpoints []string, log *slog.Logger, mods ...func(*controller.Config)) *haNode {
	t.Helper()
	cfg := simtest.Config(dir, lab, log.With("controller", id))
	cfg.StatePath, cfg.WorkDir = "", filepath.Join(dir, id)
	cfg.HA = &controller.HAConfig{Etcd: state.EtcdConfig{Endpoints: endpoints, Prefix: "/site/", RequestTimeout: 3 * time.Second},
		ID: id, TTL: 2 * time.Second}
	cfg.JoinListen, cfg.PublicURL, cfg.BMCWatchInterval = "127.0.0.1:0", publicURL, -1
	for _, m := range mods {
		m(&cfg)
	}
	c, err := simtest.Start(cfg)
	if err != nil {
		t.Fatalf("controller %s: %v", id, err)
	}
	n := &haNode{id: id, run: c.Run, ctl: c}
	t.Cleanup(n.stop)
	return n
}

// addr is the node's own HTTP URL (Running.URL is the shared VIP's).
func (n *haNode) addr() string { return "http://" + n.run.Addr.String() }

// stop ends the node's Run (if it still runs) and what it left running.
func (n *haNode) stop() { _ = n.ctl.Stop() }

// untilCleanup is t.Output() until the test's cleanups have run, then a
// sink: a deposed controller's components may outlive its Run (it leaves
// them one TTL after its term ended) and log after the test returned,
// which the testing package turns into a panic ("Write called after
// TestHATwoControllersFailover has completed", seen with -count=4).
// Registered before the lab and the controllers start, its cleanup runs
// after theirs.
func untilCleanup(t *testing.T) io.Writer {
	w := &cleanupWriter{w: t.Output()}
	t.Cleanup(func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		w.w = nil
	})
	return w
}

type cleanupWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (c *cleanupWriter) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.w == nil {
		return len(p), nil
	}
	return c.w.Write(p)
}

func waitUntil(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func call(t *testing.T, method, url, token string, body any) (int, []byte) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// TestHATwoControllersFailover runs two controllers of one group on a
// 3-member etcd over the simulated lab. Only the elected one acts: it
// registers and commissions the site while the standby's store refuses
// writes; the standby's admin API answers reads from etcd and forwards a
// write (POST /api/v1/admin-tokens) to the leader. Then the leader is cut
// off etcd: it steps down within one TTL (2 s) and controller.Run returns
// ErrDeposed once its components have drained, the standby is elected, the machines are pointed at it (the VIP
// move, in-process) and it brings the site to steady (3 deployed, the rest
// ready). ha.TestDeposedLeaderWriteFails covers the old leader's fenced
// writes.
func TestHATwoControllersFailover(t *testing.T) {
	cl := etcdtest.Start(t, etcdtest.Options{Members: 3})
	dir := t.TempDir()
	log := slog.New(slog.NewTextHandler(untilCleanup(t), &slog.HandlerOptions{Level: slog.LevelInfo}))
	labCtx, labCancel := context.WithCancel(context.Background())
	lab, err := sim.Start(labCtx, sim.Config{Dir: filepath.Join(dir, "lab"), RedfishOnly: true, Logger: log.With("lab", "sim")})
	if err != nil {
		labCancel()
		t.Fatal(err)
	}
	t.Cleanup(func() { labCancel(); lab.Close() })

	// The operator stores the BMC credentials before the controllers
	// start (machinactl secret set against any of them, in production).
	ops, err := state.OpenEtcd(state.EtcdConfig{Client: cl.Client(t), Prefix: "/site/"}, state.Options{})
	if err != nil {
		t.Fatal(err)
	}
	user, pass := lab.Credentials()
	for _, name := range []string{"bmc-redfish", "bmc-ipmi"} {
		if _, err := ops.PutSecret(name, state.Credential{Username: user, Password: pass}, "test"); err != nil {
			t.Fatalf("put secret: %v", err)
		}
	}
	_ = ops.Close()

	px := etcdtest.NewProxy(t, cl.Member(0).ClientURL)
	vip := newVIPProxy(t)
	a := startHANode(t, lab, dir, "a", vip.srv.URL, []string{px.URL()}, log)
	waitUntil(t, "a elected", 10*time.Second, a.run.Elector.IsLeader)
	b := startHANode(t, lab, dir, "b", vip.srv.URL, cl.Endpoints(), log)
	waitUntil(t, "b observing a", 10*time.Second, func() bool { c, ok := b.run.Elector.Leader(); return ok && c.ID == "a" })
	if b.run.Elector.IsLeader() {
		t.Fatal("b leads while a does")
	}
	if _, err := b.run.Store.AppendEvent(state.Event{Kind: "test", Message: "standby write"}); !errors.Is(err, state.ErrNotLeader) {
		t.Fatalf("standby's write = %v, want state.ErrNotLeader", err)
	}
	vip.move(t, a.addr())
	lab.SetController(vip.srv.URL)
	tok, _, err := a.run.Store.CreateAdminToken("ha-test", "test")
	if err != nil {
		t.Fatal(err)
	}

	// The leader registers the site and starts commissioning.
	waitUntil(t, "12 servers registered by a", 30*time.Second, func() bool {
		snap, err := b.run.Store.Snapshot()
		return err == nil && len(snap.Servers) == 12
	})
	// The standby reads the shared store and forwards writes.
	if code, body := call(t, "GET", b.addr()+"/api/v1/servers", tok, nil); code != 200 || !bytes.Contains(body, []byte("r1-n01")) {
		t.Fatalf("standby GET /api/v1/servers = %d %.200s", code, body)
	}
	code, body := call(t, "POST", b.addr()+"/api/v1/admin-tokens", tok, map[string]string{"name": "via-standby"})
	if code != http.StatusCreated {
		t.Fatalf("standby POST /api/v1/admin-tokens = %d %s, want 201 from the leader", code, body)
	}
	toks, err := a.run.Store.AdminTokens()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, at := range toks {
		found = found || at.Name == "via-standby"
	}
	if !found {
		t.Fatalf("admin token via-standby not in the store after the forwarded POST: %+v", toks)
	}

	// Cut a off etcd while the site is commissioning.
	cut := time.Now()
	px.Partition()
	waitUntil(t, "a stepping down", 2*time.Second, func() bool { return !a.run.Elector.IsLeader() })
	deposed := time.Since(cut)
	waitUntil(t, "b elected", 10*time.Second, b.run.Elector.IsLeader)
	elected := time.Since(cut)
	vip.move(t, b.addr())
	select {
	case <-a.ctl.Done():
		// Run has returned; what it left running (the controller leaves
		// components still stopping one TTL after the term) sees its
		// context end now.
		err := a.ctl.Stop()
		// Which side notices first (its own renewal deadline, or the
		// client's keepalive ending the session) is a race: both say the
		// lease is gone.
		if !errors.Is(err, controller.ErrDeposed) || !(errors.Is(err, ha.ErrUnreachable) || errors.Is(err, ha.ErrLeaseLost)) {
			t.Fatalf("a's Run = %v, want ErrDeposed (etcd unreachable or lease lost)", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("a's Run still running 30 s after it was cut off etcd")
	}
	t.Logf("after the cut: a stepped down in %s, b elected in %s, a's Run returned ErrDeposed in %s", deposed, elected, time.Since(cut))

	h := &harness{t: t, lab: lab, run: b.run}
	h.waitFor("site commissioned and deployed by b", 2*time.Minute, func(s state.Snapshot) bool {
		deployed := 0
		for _, srv := range s.Servers {
			switch srv.Lifecycle {
			case state.LifecycleDeployed:
				deployed++
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
		return len(s.Servers) == 12 && deployed == 3
	})
}
