// Command failover measures the HA failover gap: `go run
// ./bench/failover -etcd 127.0.0.1:2379,... -servers 50 -kills 5`. It runs
// two `machina serve` processes (bin/machina, `make build`) of one group
// on the given etcd cluster against the simulated lab, SIGKILLs the leader
// while servers commission or deploy, restarts it as a standby, and for
// each kill prints the time from the SIGKILL to
//   - elected: the standby holding the election key (read from etcd);
//   - first action: the first BMC write request (POST, PATCH or DELETE at
//     any simulated BMC; the dead leader sends nothing more), the new
//     leader's first reconcile action;
//   - first machine answer: the first 2xx answer to a machine request (no
//     admin token) through the VIP stand-in, the proxy the simulated
//     machines talk to, which forwards to the leader named in etcd. The
//     simulated lab has no DHCP (its machines start at the iPXE script), so
//     this is the figure for the boot services' gap; the DHCP server starts
//     with the same leadership (docs/ha.md).
//
// then min, median and max of each. The killed controller is restarted
// and answers /healthz (then 5 s more) before the next kill, so each
// kill meets a standby that is up. When the fleet has converged before a
// kill, it first provisions 4% of the servers more (at least 2) through
// the admin API, so the next leader has deploys to drive. A kill after which nothing
// happens within -wait prints "-" for the last two. The first action is
// the first one due: a leader with nothing to do at once (machines still
// booting) acts later, so it bounds the gap from above.
// Every state lives under a fresh prefix /machina-failover-UNIXNANO,
// deleted at the end; the processes are ended by PID.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/ha"
	"github.com/machina-metal/machina/lab/sim"
	"github.com/machina-metal/machina/state"
)

func main() {
	eps := flag.String("etcd", os.Getenv("MACHINA_FAILOVER_ETCD"), "etcd client endpoints HOST:PORT[,HOST:PORT] (plain HTTP; env MACHINA_FAILOVER_ETCD); required")
	servers := flag.Int("servers", 50, "simulated servers (10% deployed)")
	kills := flag.Int("kills", 5, "leader SIGKILLs")
	ttl := flag.Duration("ttl", 5*time.Second, "the controllers' --ha-ttl (election lease)")
	bin := flag.String("machina", "bin/machina", "machina binary (make build)")
	wait := flag.Duration("wait", time.Minute, "how long to wait for the new leader's first action after each kill")
	flag.Parse()
	if *eps == "" {
		fmt.Fprintln(os.Stderr, "failover: -etcd is required")
		os.Exit(2)
	}
	if err := run(*eps, *servers, *kills, *ttl, *bin, *wait); err != nil {
		fmt.Fprintln(os.Stderr, "failover:", err)
		os.Exit(1)
	}
}

// vip stands in for the provisioning VIP: it forwards to the admin URL in
// the current election value and notes when a machine request (one
// without an Authorization header) was last answered 2xx.
type vip struct {
	cli      *clientv3.Client
	prefix   string
	mu       sync.Mutex
	cached   *url.URL
	at       time.Time
	answered atomic.Int64 // UnixNano of the last 2xx machine answer
}

func (v *vip) leader(ctx context.Context) (ha.Candidate, bool) {
	c, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	resp, err := v.cli.Get(c, v.prefix, clientv3.WithFirstCreate()...)
	if err != nil || len(resp.Kvs) == 0 {
		return ha.Candidate{}, false
	}
	var cand ha.Candidate
	return cand, json.Unmarshal(resp.Kvs[0].Value, &cand) == nil
}

func (v *vip) target(ctx context.Context) *url.URL {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.cached != nil && time.Since(v.at) < 100*time.Millisecond {
		return v.cached
	}
	v.cached = nil
	if cand, ok := v.leader(ctx); ok {
		if u, err := url.Parse(cand.AdminURL); err == nil {
			v.cached, v.at = u, time.Now()
		}
	}
	return v.cached
}

type statusWriter struct {
	http.ResponseWriter
	code int
}

func (w *statusWriter) WriteHeader(c int) { w.code = c; w.ResponseWriter.WriteHeader(c) }

func (v *vip) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	u := v.target(r.Context())
	if u == nil {
		http.Error(w, "no leader holds the VIP", http.StatusServiceUnavailable)
		return
	}
	sw := &statusWriter{ResponseWriter: w, code: http.StatusOK}
	(&httputil.ReverseProxy{Rewrite: func(pr *httputil.ProxyRequest) { pr.SetURL(u); pr.Out.Host = pr.In.Host },
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, _ error) { w.WriteHeader(http.StatusBadGateway) }}).ServeHTTP(sw, r)
	if r.Header.Get("Authorization") == "" && sw.code < 300 {
		v.answered.Store(time.Now().UnixNano())
	}
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

type proc struct {
	id     string
	port   int
	cmd    *exec.Cmd
	exited chan struct{}
	runs   int
}

// bmcWrites counts the write requests every simulated BMC recorded.
func bmcWrites(lab *sim.Lab) int {
	w := 0
	for _, m := range lab.Machines() {
		for _, q := range lab.BMC(m.Name).Requests() {
			if q.Method == http.MethodPost || q.Method == http.MethodPatch || q.Method == http.MethodDelete {
				w++
			}
		}
	}
	return w
}

// inMotion reports whether a server is being commissioned or deployed.
func inMotion(ctx context.Context, c *v1.Client, n int) bool {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	page, err := c.ListServers(cctx, v1.ListServersOptions{Limit: 1000})
	if err != nil {
		return false
	}
	for _, s := range page.Servers {
		switch s.Lifecycle {
		case "new", "commissioning", "allocated", "deploying":
			return true
		}
	}
	return len(page.Servers) < n
}

// waitHealthy waits until the controller on port answers GET /healthz.
func waitHealthy(ctx context.Context, port int, within time.Duration) error {
	url := "http://127.0.0.1:" + strconv.Itoa(port) + "/healthz"
	for t0 := time.Now(); time.Since(t0) < within; time.Sleep(100 * time.Millisecond) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
	}
	return fmt.Errorf("no answer to GET /healthz on port %d within %s", port, within)
}

// provision allocates k more ready servers to one of sim's generated
// profiles (admin API POST /api/v1/provision, the first with room), so
// the leader has deploys to drive.
func provision(ctx context.Context, c *v1.Client, k int) error {
	var errs []error
	for _, p := range []string{"hypervisor", "storage", "gpu"} {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := c.Provision(cctx, v1.ProvisionRequest{Profile: p, Count: k})
		cancel()
		if err == nil {
			return nil
		}
		errs = append(errs, err)
	}
	return fmt.Errorf("provision %d servers: %w", k, errors.Join(errs...))
}

func run(eps string, n, kills int, ttl time.Duration, bin string, wait time.Duration) error {
	if _, err := os.Stat(bin); err != nil {
		return fmt.Errorf("%s: %w (make build)", bin, err)
	}
	dir, err := os.MkdirTemp("", "machina-bench-failover.")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	endpoints := strings.Split(eps, ",")
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second})
	if err != nil {
		return err
	}
	defer cli.Close()
	prefix := fmt.Sprintf("/machina-failover-%d", time.Now().UnixNano())
	defer func() {
		c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, _ = cli.Delete(c, prefix+"/", clientv3.WithPrefix())
	}()

	lab, err := sim.Start(ctx, sim.Config{Dir: filepath.Join(dir, "lab"), Servers: n, RedfishOnly: true, BootDelay: 5 * time.Second,
		ImageBytes: 8 << 20, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return err
	}
	defer lab.Close()
	ops, err := state.OpenEtcd(state.EtcdConfig{Client: cli, Prefix: prefix + "/"}, state.Options{})
	if err != nil {
		return err
	}
	user, pass := lab.Credentials()
	for _, name := range []string{"bmc-redfish", "bmc-ipmi"} {
		if _, err := ops.PutSecret(name, state.Credential{Username: user, Password: pass}, state.ActorLocal); err != nil {
			return err
		}
	}
	adminTok, _, err := ops.CreateAdminToken("bench-failover", state.ActorLocal)
	if err != nil {
		return err
	}
	_ = ops.Close()

	v := &vip{cli: cli, prefix: prefix + "/leader/"}
	vsrv := httptest.NewServer(v)
	defer vsrv.Close()
	lab.SetController(vsrv.URL)
	client, err := v1.NewClient(vsrv.URL, adminTok)
	if err != nil {
		return err
	}
	target := "etcd://" + eps + prefix

	procs := map[string]*proc{}
	for _, id := range []string{"a", "b"} {
		port, err := freePort()
		if err != nil {
			return err
		}
		procs[id] = &proc{id: id, port: port}
	}
	start := func(p *proc) error {
		p.runs++
		logf, err := os.Create(filepath.Join(dir, fmt.Sprintf("%s-%02d.log", p.id, p.runs)))
		if err != nil {
			return err
		}
		jp, err := freePort()
		if err != nil {
			return err
		}
		self := "http://127.0.0.1:" + strconv.Itoa(p.port)
		cmd := exec.Command(bin, "serve", "--state", target, "--ha-id", p.id, "--ha-ttl", ttl.String(), "--ha-admin-url", self,
			"--work-dir", filepath.Join(dir, "work-"+p.id), "--repo", lab.RepoURL,
			"--listen", "127.0.0.1:"+strconv.Itoa(p.port), "--join-listen", "127.0.0.1:"+strconv.Itoa(jp), "--public-url", vsrv.URL,
			"--poll-interval", "1s", "--reconcile-interval", "1s", "--status-interval", "5s", "--bmc-watch-interval", "-1s",
			"--machine-burst", "100000", "--machine-refill", "1ms", "--max-conns-per-ip", "100000", "--workers", "32", "--per-rack", "40",
			"--machine-silent-after", "60s", "--log-format", "text")
		cmd.Stdout, cmd.Stderr = logf, logf
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			return err
		}
		p.cmd, p.exited = cmd, make(chan struct{})
		go func(ex chan struct{}) { _ = cmd.Wait(); logf.Close(); close(ex) }(p.exited)
		return nil
	}
	defer func() {
		for _, p := range procs {
			if p.cmd != nil && p.cmd.ProcessState == nil {
				_ = p.cmd.Process.Signal(syscall.SIGKILL) // our own child, by PID
				<-p.exited
			}
		}
	}()
	for _, id := range []string{"a", "b"} {
		if err := start(procs[id]); err != nil {
			return err
		}
	}
	waitLeader := func(not string, within time.Duration) (string, time.Time, error) {
		for t0 := time.Now(); time.Since(t0) < within; time.Sleep(20 * time.Millisecond) {
			if c, ok := v.leader(ctx); ok && c.ID != not {
				return c.ID, time.Now(), nil
			}
		}
		return "", time.Time{}, fmt.Errorf("no leader other than %q within %s", not, within)
	}
	leader, _, err := waitLeader("", time.Minute)
	if err != nil {
		return err
	}
	fmt.Printf("failover: %d servers, 2 controllers on etcd (%s), --ha-ttl %s, %d leader SIGKILLs while servers commission or deploy\n", n, eps, ttl, kills)
	var elected, action, answer []time.Duration
	show := func(d time.Duration, ok bool) string {
		if !ok {
			return "-"
		}
		return d.Round(10 * time.Millisecond).String()
	}
	for k := 1; k <= kills; k++ {
		if !inMotion(ctx, client, n) {
			// The fleet converged: give the next leader work, as an
			// operator provisioning more servers would.
			if err := provision(ctx, client, max(n/25, 2)); err != nil {
				return err
			}
		}
		for deadline := time.Now().Add(2 * time.Minute); !inMotion(ctx, client, n) && time.Now().Before(deadline); {
			time.Sleep(200 * time.Millisecond)
		}
		time.Sleep(time.Second)
		p := procs[leader]
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
		<-p.exited
		killed := time.Now()
		writes := bmcWrites(lab)
		next, at, err := waitLeader(leader, ttl+30*time.Second)
		if err != nil {
			return err
		}
		el := at.Sub(killed)
		elected = append(elected, el)
		var act, ans time.Duration
		var gotAct, gotAns bool
		for time.Since(killed) < wait && (!gotAct || !gotAns) {
			if !gotAct && bmcWrites(lab) > writes {
				act, gotAct = time.Since(killed), true
			}
			if a := v.answered.Load(); !gotAns && a > killed.UnixNano() {
				ans, gotAns = time.Unix(0, a).Sub(killed), true
			}
			time.Sleep(20 * time.Millisecond)
		}
		if gotAct {
			action = append(action, act)
		}
		if gotAns {
			answer = append(answer, ans)
		}
		fmt.Printf("kill %d: leader %s SIGKILLed; %s elected %s later; first BMC action %s; first machine answer %s\n",
			k, leader, next, show(el, true), show(act, gotAct), show(ans, gotAns))
		if err := start(p); err != nil {
			return err
		}
		// The next kill meets a running standby: the restarted one
		// answers /healthz (its API up, its store open), then gets 5 s
		// for its Git clone, as a standby that has been up a while has.
		if err := waitHealthy(ctx, p.port, time.Minute); err != nil {
			return fmt.Errorf("restarted %s: %w", p.id, err)
		}
		time.Sleep(5 * time.Second)
		leader = next
	}
	stats := func(name string, ds []time.Duration) {
		if len(ds) == 0 {
			fmt.Printf("%s: none of %d kills\n", name, kills)
			return
		}
		slices.Sort(ds)
		fmt.Printf("%s: min %s, median %s, max %s (%d of %d kills)\n", name, show(ds[0], true), show(ds[len(ds)/2], true), show(ds[len(ds)-1], true), len(ds), kills)
	}
	fmt.Println("failover gap, from the leader's SIGKILL:")
	stats("  to the standby elected", elected)
	stats("  to its first reconcile action (BMC write)", action)
	stats("  to its first machine answer (via the VIP)", answer)
	return nil
}
