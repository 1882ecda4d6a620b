// Command scale measures how far one controller scales on the simulated
// lab: `go run ./bench/scale -servers 100,1000`. The controller runs as its
// own process (`machina serve`, built from this tree), so its CPU time and
// peak memory are read from /proc apart from the simulated lab's, which
// runs in this process. For each size it reports the time from the
// inventory commit to every server ready, the time to deploy each
// profile's count (10% of the servers), the controller's CPU seconds and
// peak RSS, the status commit count and the repository's growth per 1,000
// lifecycle transitions. With -etcd etcd://HOST:PORT/PREFIX (or
// MACHINA_SCALE_ETCD) the controller keeps its state in that etcd instead
// of a bbolt file (a fresh prefix per size), to set both engines side by
// side; the etcd cluster is the operator's (e.g. internal/etcdtest's
// layout, or three members of Debian's etcd-server).
//
// Each size's controller log, the lab's log (warnings: a heartbeat of a
// simulated host that failed) and the controller's /metrics at the end
// are kept in -out DIR/N/ (default a new machina-scale-logs-* folder under
// $TMPDIR, named on stdout). A WARN or ERROR line in either log that
// controllerAllowed does not list (each entry with its reason) fails the
// run (exit status 1, after every size ran), naming the first lines; the
// table's "controller warnings, errors" column counts those.
//
// SIGINT or SIGTERM stops the run: the controller gets SIGTERM by its PID
// (SIGKILL 10 s later if still running), the size's temporary folder (state
// file, simulated machines' files: gigabytes at thousands of servers) is
// removed, and the bench exits 128+signal.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/machina-metal/machina/lab/sim"
	"golang.org/x/sys/unix"
)

func main() {
	sizes := flag.String("servers", "100,1000", "comma-separated lab sizes")
	bin := flag.String("machina", "bin/machina", "machina binary (make build)")
	timeout := flag.Duration("timeout", 15*time.Minute, "per size")
	workers := flag.Int("workers", 64, "controller --workers")
	flag.StringVar(&memLimit, "memlimit", "", "run the controller with GOMEMLIMIT set to this (Go's soft memory limit, e.g. 256MiB); empty leaves it unset")
	flag.StringVar(&cpuProfileDir, "cpuprofile", "", "write the controller's CPU and heap profiles for each size to DIR/controller-N.pprof and .heap, and the lab's CPU profile to DIR/lab-N.pprof")
	flag.StringVar(&etcdState, "etcd", os.Getenv("MACHINA_SCALE_ETCD"), "run the controller on etcd instead of a bbolt file: an etcd site URL etcd://HOST:PORT[,HOST:PORT]/PREFIX[?ca=FILE&cert=FILE&key=FILE] (env MACHINA_SCALE_ETCD); each size uses a fresh prefix PREFIX/scale-N-UNIXNANO under it; empty: bbolt")
	flag.StringVar(&outDir, "out", "", "keep each size's controller log, lab log and final /metrics in DIR/N/ (default: a new folder machina-scale-logs-* under $TMPDIR, kept and named on stdout)")
	flag.DurationVar(&hold, "hold", 0, "after the counts are deployed, keep the lab and the controller running this long (joined hosts heartbeat meanwhile) before the warnings are counted")
	flag.DurationVar(&heartbeat, "heartbeat", 0, "the controller's --heartbeat (0: its default, 30s)")
	flag.StringVar(&labTmp, "labtmp", "/dev/shm", "put the simulated machines' folders (sysfs trees, disk files) in a new folder under DIR when DIR is a tmpfs with room for them, the rest of the lab and the controller's files staying on disk; empty (or no tmpfs there): beside the lab")
	flag.IntVar(&labGOGC, "labgogc", 400, "this process's (the simulated lab's) GOGC, under a 4 GiB soft memory limit, unless the GOGC environment variable is set; 0 leaves Go's default (100)")
	flag.Parse()
	if labGOGC > 0 && os.Getenv("GOGC") == "" {
		debug.SetGCPercent(labGOGC)
		debug.SetMemoryLimit(4 << 30)
	}
	raiseFileLimit()
	stopOnSignal(running, 10*time.Second, syscall.SIGINT, syscall.SIGTERM)
	if outDir == "" {
		d, err := os.MkdirTemp("", "machina-scale-logs-")
		if err != nil {
			fmt.Fprintln(os.Stderr, "scale:", err)
			os.Exit(1)
		}
		outDir = d
	}
	fmt.Printf("logs: %s\n", outDir)
	if cpuProfileDir != "" {
		if err := os.MkdirAll(cpuProfileDir, 0o755); err != nil {
			fmt.Fprintln(os.Stderr, "scale:", err)
			os.Exit(1)
		}
	}
	if etcdState != "" {
		fmt.Printf("state engine: etcd (%s)\n\n", strings.SplitN(etcdState, "?", 2)[0])
	} else {
		fmt.Printf("state engine: bbolt\n\n")
	}
	fmt.Printf("| servers | commit → all ready | commit → counts deployed | controller CPU s | controller peak RSS MiB (anonymous, sampled) | lab (sim) CPU s | transitions | status commits | repo growth per 1,000 transitions | controller warnings, errors |\n|---|---|---|---|---|---|---|---|---|---|\n")
	for _, f := range strings.Split(*sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			fmt.Fprintln(os.Stderr, "scale: bad size", f)
			os.Exit(2)
		}
		if err := checkFileLimit(n); err != nil {
			fmt.Fprintf(os.Stderr, "scale: %d servers: %v\n", n, err)
			failed = true
			continue
		}
		_, err = measure(n, *bin, *workers, *timeout)
		if err != nil {
			fmt.Fprintf(os.Stderr, "scale: %d servers: %v\n", n, err)
			failed = true
		}
	}
	if failed {
		os.Exit(1)
	}
}

// failed is set by a size that failed; the others still run.
var failed bool

// cpuProfileDir is the -cpuprofile flag: empty means no profile.
var cpuProfileDir string

// outDir is the -out flag; heartbeat the -heartbeat flag.
var (
	outDir          string
	heartbeat, hold time.Duration
)

// labTmp is the -labtmp flag; labGOGC the -labgogc flag.
var (
	labTmp  string
	labGOGC int
)

// labMachinesDir returns a new folder under -labtmp for n simulated
// machines, or "" when -labtmp is empty, not a tmpfs, or has less room
// than n machines' trees (about 200 KiB each) and the tenth of them
// deployed (a 4 MiB image and its seed, 8 MiB counted) take there.
func labMachinesDir(n int) (string, error) {
	var st unix.Statfs_t
	if labTmp == "" || unix.Statfs(labTmp, &st) != nil || st.Type != unix.TMPFS_MAGIC {
		return "", nil
	}
	if need := uint64(n)*200<<10 + uint64(n/10+1)*8<<20; st.Bavail*uint64(st.Bsize) < need {
		fmt.Fprintf(os.Stderr, "scale: lab machines on disk: %s has %d MiB free, %d servers need about %d\n", labTmp, st.Bavail*uint64(st.Bsize)>>20, n, need>>20)
		return "", nil
	}
	return os.MkdirTemp(labTmp, "machina-scale-machines-")
}

// memLimit is the -memlimit flag: the controller's GOMEMLIMIT, or "".
var memLimit string

// etcdState is the -etcd flag: the etcd site URL, or "" for bbolt.
var etcdState string

// stateTarget is the --state of one size: a file in dir, or a fresh
// prefix under the -etcd site (the query, TLS files, kept at the end).
func stateTarget(dir string, n int) string {
	if etcdState == "" {
		return filepath.Join(dir, "state.db")
	}
	base, query, _ := strings.Cut(etcdState, "?")
	t := strings.TrimSuffix(base, "/") + fmt.Sprintf("/scale-%d-%d", n, time.Now().UnixNano())
	if query != "" {
		t += "?" + query
	}
	return t
}

func measure(n int, bin string, workers int, timeout time.Duration) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	dir, err := os.MkdirTemp("", "machina-scale-")
	if err != nil {
		return "", err
	}
	running.removeAtExit(dir)
	defer func() { running.removed(dir); os.RemoveAll(dir) }()
	machines, err := labMachinesDir(n)
	if err != nil {
		return "", err
	}
	if machines != "" {
		running.removeAtExit(machines)
		defer func() { running.removed(machines); os.RemoveAll(machines) }()
	}
	if cpuProfileDir != "" {
		f, err := os.Create(filepath.Join(cpuProfileDir, fmt.Sprintf("lab-%d.pprof", n)))
		if err != nil {
			return "", err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			return "", err
		}
		defer func() { pprof.StopCPUProfile(); f.Close() }()
	}
	logDir := filepath.Join(outDir, strconv.Itoa(n))
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		return "", err
	}
	labLog, err := os.Create(filepath.Join(logDir, "lab.log"))
	if err != nil {
		return "", err
	}
	defer labLog.Close()
	var lab *sim.Lab
	err = running.inProcess(ctx, func(ctx context.Context) (err error) {
		lab, err = sim.Start(ctx, sim.Config{Dir: filepath.Join(dir, "lab"), MachinesDir: machines, Servers: n, Logger: slog.New(slog.NewTextHandler(labLog, &slog.HandlerOptions{Level: slog.LevelWarn}))})
		return err
	})
	if err != nil {
		return "", err
	}
	defer lab.Close()
	commitAt := time.Now() // the lab pushed the inventory commit just now
	// The lab's CPU is counted from here: writing each machine's simulated
	// sysfs tree in Start happens before the commit and is not measured.
	labCPU0 := selfCPU()

	state := stateTarget(dir, n)
	out, err := exec.Command(bin, "token", "create", "--name", "bench", "--state", state).Output()
	if err != nil {
		return "", fmt.Errorf("token create: %w", err)
	}
	token := lastField(string(out))
	port, err := freePort()
	if err != nil {
		return "", err
	}
	api := "http://127.0.0.1:" + strconv.Itoa(port)
	logf, _ := os.Create(filepath.Join(logDir, "controller.log"))
	defer logf.Close()
	// The BMC secrets go into the state file first, through a controller
	// started without --repo (state store and admin API only), as an
	// operator does before the first reconcile: a controller that starts
	// reconciling first stalls every server on the missing credential.
	pre := exec.CommandContext(ctx, bin, "serve", "--state", state, "--listen", "127.0.0.1:"+strconv.Itoa(port), "--log-format", "text")
	pre.Stderr, pre.Stdout = logf, logf
	if err := running.start(pre); err != nil {
		return "", err
	}
	err = waitHTTP(ctx, api+"/healthz")
	for _, name := range []string{"bmc-redfish", "bmc-ipmi"} {
		if err != nil {
			break
		}
		user, pass := lab.Credentials()
		body, _ := json.Marshal(map[string]string{"username": user, "password": pass})
		if err = call(ctx, http.MethodPut, api+"/api/v1/secrets/"+name, token, body, nil); err != nil {
			err = fmt.Errorf("store secret: %w", err)
		}
	}
	_ = pre.Process.Signal(os.Interrupt)
	_ = running.wait(pre)
	if err != nil {
		return "", err
	}
	cmd := exec.CommandContext(ctx, bin, "serve", "--repo", lab.RepoURL, "--state", state, "--listen", "127.0.0.1:"+strconv.Itoa(port),
		"--join-listen", "127.0.0.1:0", "--work-dir", filepath.Join(dir, "work"), "--poll-interval", "500ms", "--status-interval", "5s",
		"--workers", strconv.Itoa(workers), "--per-rack", "40", "--reconcile-interval", "500ms", "--machine-burst", "100000", "--machine-refill", "1ms",
		"--log-format", "text")
	if heartbeat > 0 {
		cmd.Args = append(cmd.Args, "--heartbeat", heartbeat.String())
	}
	if cpuProfileDir != "" {
		cmd.Args = append(cmd.Args, "--cpu-profile", filepath.Join(cpuProfileDir, fmt.Sprintf("controller-%d.pprof", n)),
			"--mem-profile", filepath.Join(cpuProfileDir, fmt.Sprintf("controller-%d.heap", n)))
	}
	cmd.Stderr, cmd.Stdout = logf, logf
	if memLimit != "" {
		cmd.Env = append(os.Environ(), "GOMEMLIMIT="+memLimit)
	}
	if err := running.start(cmd); err != nil {
		return "", err
	}
	defer func() { _ = cmd.Process.Signal(os.Interrupt); _ = running.wait(cmd) }()
	if err := waitHTTP(ctx, api+"/healthz"); err != nil {
		return "", err
	}
	lab.SetController(api)

	var readyAt, deployedAt time.Duration
	var peakAnon float64
	want := 3 * max(n/30, 1)
	for readyAt == 0 || deployedAt == 0 {
		var st struct {
			Servers map[string]int `json:"servers"`
		}
		if err := call(ctx, http.MethodGet, api+"/api/v1/status", token, nil, &st); err != nil {
			return "", err
		}
		// RSS = anonymous memory (heap, stacks) + file pages, mostly the
		// state file bbolt maps; the kernel keeps only the total's peak.
		peakAnon = max(peakAnon, procStatus(cmd.Process.Pid, "RssAnon:"))
		up := st.Servers["ready"] + st.Servers["allocated"] + st.Servers["deploying"] + st.Servers["deployed"]
		if readyAt == 0 && up == n {
			readyAt = time.Since(commitAt)
		}
		if deployedAt == 0 && st.Servers["deployed"] >= want {
			deployedAt = time.Since(commitAt)
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("timed out: %v", st.Servers)
		case <-time.After(250 * time.Millisecond):
		}
	}
	cpu, rss := procCPU(cmd.Process.Pid), procHWM(cmd.Process.Pid)
	transitions := 0
	for after := uint64(0); ; {
		var page struct {
			Events []struct{ Kind string }
			Next   uint64
		}
		if err := call(ctx, http.MethodGet, fmt.Sprintf("%s/api/v1/events?limit=10000&after=%d", api, after), token, nil, &page); err != nil {
			return "", err
		}
		for _, e := range page.Events {
			if e.Kind == "lifecycle" {
				transitions++
			}
		}
		if page.Next == 0 || len(page.Events) == 0 {
			break
		}
		after = page.Next
	}
	time.Sleep(6 * time.Second) // let the status writer commit what it saw
	if hold > 0 {
		select {
		case <-ctx.Done():
		case <-time.After(hold):
		}
	}
	var metrics []byte
	if resp, err := http.Get(api + "/metrics"); err == nil {
		if b, err := io.ReadAll(resp.Body); err == nil {
			metrics = b
			_ = os.WriteFile(filepath.Join(logDir, "metrics.txt"), b, 0o644)
		}
		resp.Body.Close()
	}
	passes, planSec := metricValue(metrics, "machina_reconcile_duration_seconds_count"), metricValue(metrics, "machina_reconcile_duration_seconds_sum")
	detail := fmt.Sprintf("  %d servers: %.0f planning passes (%.1f s), %.2f passes per transition", n, passes, planSec, passes/float64(max(transitions, 1)))
	if etcdState == "" {
		if tx := boltTxID(state); tx > 0 {
			detail += fmt.Sprintf("; %d bbolt commits (2 fdatasync each), %.2f per transition", tx, float64(tx)/float64(max(transitions, 1)))
		}
	}
	if cpu > 0 && transitions > 0 {
		detail += fmt.Sprintf("; %.1f ms controller CPU per transition", 1000*cpu/float64(transitions))
	}
	if etcdState != "" {
		detail += "\n" + etcdDetail(n, metrics, transitions)
	}
	commits, size := repoStats(strings.TrimPrefix(lab.RepoURL, "file://"))
	growth := "n/a"
	if transitions > 0 {
		growth = fmt.Sprintf("%.0f KiB", float64(size)/1024/float64(transitions)*1000)
	}
	ctl, err := scanLog(filepath.Join(logDir, "controller.log"), controllerAllowed)
	if err != nil {
		return "", err
	}
	lb, err := scanLog(filepath.Join(logDir, "lab.log"), nil)
	if err != nil {
		return "", err
	}
	row := fmt.Sprintf("| %d | %.1f s | %.1f s | %.1f | %.0f (%.0f) | %.1f | %d | %d | %s | %d, %d |", n, readyAt.Seconds(), deployedAt.Seconds(), cpu, rss, peakAnon, selfCPU()-labCPU0, transitions, commits, growth, ctl.warns, ctl.errs)
	fmt.Println(row) // before the deferred clean-up, which takes minutes at 10,000 servers
	fmt.Println(detail)
	for _, a := range controllerAllowed {
		if c := ctl.allowed[a.match]; c > 0 {
			fmt.Printf("  %d servers: %d allowed controller warning(s) %q: %s\n", n, c, a.match, a.reason)
		}
	}
	if bad := append(ctl.unexpected, lb.unexpected...); len(bad) > 0 {
		return row, fmt.Errorf("%d unexpected controller warnings and errors, %d lab warnings (logs in %s); the first:\n%s",
			ctl.warns+ctl.errs, lb.warns+lb.errs, logDir, strings.Join(bad[:min(len(bad), 10)], "\n"))
	}
	return row, nil
}

func lastField(s string) string {
	f := strings.Fields(s)
	for _, x := range f {
		if strings.HasPrefix(x, "mna_") {
			return x
		}
	}
	if len(f) == 0 {
		return ""
	}
	return f[len(f)-1]
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

func waitHTTP(ctx context.Context, url string) error {
	for {
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func call(ctx context.Context, method, url, token string, body []byte, out any) error {
	req, err := http.NewRequestWithContext(ctx, method, url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode >= 300 {
		return fmt.Errorf("%s %s: HTTP %d: %s", method, url, resp.StatusCode, b)
	}
	if out != nil {
		return json.Unmarshal(b, out)
	}
	return nil
}

// procCPU is a process's user+system CPU seconds (/proc/PID/stat fields 14, 15).
func procCPU(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return -1
	}
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+2:]))
	u, _ := strconv.ParseFloat(f[11], 64)
	s, _ := strconv.ParseFloat(f[12], 64)
	return (u + s) / 100 // USER_HZ
}

// procHWM is a process's peak resident set in MiB (/proc/PID/status VmHWM).
func procHWM(pid int) float64 { return procStatus(pid, "VmHWM:") }

// procStatus reads one kB field of /proc/PID/status, in MiB (-1 if absent).
func procStatus(pid int, field string) float64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return -1
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if fs := strings.Fields(sc.Text()); len(fs) >= 2 && fs[0] == field {
			kb, _ := strconv.ParseFloat(fs[1], 64)
			return kb / 1024
		}
	}
	return -1
}

func selfCPU() float64 { return procCPU(os.Getpid()) }

// repoStats counts commits on main and the repository's size in bytes.
func repoStats(bare string) (int, int64) {
	out, _ := exec.Command("git", "--git-dir", bare, "rev-list", "--count", "main").Output()
	n, _ := strconv.Atoi(strings.TrimSpace(string(out)))
	var size int64
	_ = filepath.Walk(bare, func(_ string, fi os.FileInfo, err error) error {
		if err == nil && !fi.IsDir() {
			size += fi.Size()
		}
		return nil
	})
	return n, size
}

// raiseFileLimit lifts RLIMIT_NOFILE as far as this process may (root: to
// 1<<20): at 10,000 servers the lab holds one listener per simulated BMC
// plus the controller's keep-alive connections to them, and the controller
// process, started from here, inherits the limit.
func raiseFileLimit() {
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err != nil {
		return
	}
	want := unix.Rlimit{Cur: 1 << 20, Max: 1 << 20}
	if rl.Max >= want.Max || unix.Setrlimit(unix.RLIMIT_NOFILE, &want) != nil {
		rl.Cur = rl.Max
		_ = unix.Setrlimit(unix.RLIMIT_NOFILE, &rl)
	}
}

// labFilesPerServer and labFilesSpare size checkFileLimit, a floor rather
// than the peak: each simulated BMC holds one listening socket for the
// whole run (lab/sim: one net.Listen per BMC, as each real BMC has its own
// address); the spare covers the lab's other listeners and files and the
// connections open at a time (the controller's --workers Redfish requests,
// the machine agents' requests).
const (
	labFilesPerServer = 1
	labFilesSpare     = 2000
)

// checkFileLimit fails before a run of n servers that this process's
// RLIMIT_NOFILE (after raiseFileLimit) cannot hold: such a run used to
// start, fill the lab's listeners until accept(2) failed with EMFILE ("too
// many open files") and then time out. Raising the hard limit needs
// CAP_SYS_RESOURCE (setrlimit(2)); a container without it keeps the
// limit it was given.
func checkFileLimit(n int) error {
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err != nil {
		return fmt.Errorf("read RLIMIT_NOFILE: %w", err)
	}
	need := uint64(n)*labFilesPerServer + labFilesSpare
	if rl.Cur < need {
		return fmt.Errorf("the simulated lab needs about %d open files (%d a server and %d more) but RLIMIT_NOFILE is %d (hard %d) and could not be raised: run as root with CAP_SYS_RESOURCE, or raise the limit first (ulimit -Hn, systemd LimitNOFILE=, docker --ulimit nofile=)", need, labFilesPerServer, labFilesSpare, rl.Cur, rl.Max)
	}
	return nil
}

// metricValue is the value of the first sample of name (with or without
// labels) in a Prometheus text exposition, 0 if absent.
func metricValue(exposition []byte, name string) float64 {
	for _, l := range strings.Split(string(exposition), "\n") {
		if !strings.HasPrefix(l, name+" ") && !strings.HasPrefix(l, name+"{") {
			continue
		}
		f := strings.Fields(l)
		v, _ := strconv.ParseFloat(f[len(f)-1], 64)
		return v
	}
	return 0
}

// etcdDetail summarises the controller's etcd requests (api's
// machina_state_etcd_* metrics, state.EtcdStats): round trips by kind and
// per transition, calls per shared transaction, conflicts, the write
// cache's hits, and the summed waits (over concurrent callers, so they
// can exceed the wall time).
func etcdDetail(n int, m []byte, transitions int) string {
	lv := func(name, label string) float64 { return metricLabelled(m, name, label) }
	per := func(v float64) float64 { return v / float64(max(transitions, 1)) }
	txn, ur, vr, rr := lv("machina_state_etcd_requests_total", "txn"), lv("machina_state_etcd_requests_total", "update_range"),
		lv("machina_state_etcd_requests_total", "view_range"), lv("machina_state_etcd_requests_total", "revision")
	ms := func(kind string, c float64) float64 {
		return 1000 * lv("machina_state_etcd_request_seconds_total", kind) / max(c, 1)
	}
	updates, calls := metricValue(m, "machina_state_etcd_updates_total"), metricValue(m, "machina_state_etcd_update_calls_total")
	return fmt.Sprintf("  %d servers, etcd requests: %.0f commits (%.2f per transition, %.2f calls each, %.1f ms each, %.0f conflicts), "+
		"%.0f update reads (%.2f per transition, %.1f ms each; write cache %.0f hits, %.0f misses, %.0f reruns), "+
		"%.0f revision reads (%.1f ms each) for %.0f views (%.0f read etcd directly, %.0f range reads); "+
		"summed waits: writer lock %.1f s, views %.1f s, commits %.1f s",
		n, txn, per(txn), calls/max(updates, 1), ms("txn", txn), metricValue(m, "machina_state_etcd_conflicts_total"),
		ur, per(ur), ms("update_range", ur), lv("machina_state_etcd_cache_reads_total", "hit"), lv("machina_state_etcd_cache_reads_total", "miss"),
		metricValue(m, "machina_state_etcd_cache_reruns_total"),
		rr, ms("revision", rr), lv("machina_state_etcd_views_total", "replica")+lv("machina_state_etcd_views_total", "etcd"),
		lv("machina_state_etcd_views_total", "etcd"), vr,
		lv("machina_state_etcd_wait_seconds_total", "writer_lock"), lv("machina_state_etcd_wait_seconds_total", "view"),
		lv("machina_state_etcd_request_seconds_total", "txn"))
}

// metricLabelled is the value of the sample of name whose one label has
// the value label (name{kind="txn"}), 0 if absent.
func metricLabelled(exposition []byte, name, label string) float64 {
	for _, l := range strings.Split(string(exposition), "\n") {
		rest, ok := strings.CutPrefix(l, name+"{")
		if !ok {
			continue
		}
		labels, val, ok := strings.Cut(rest, "} ")
		if !ok || !strings.HasSuffix(labels, "=\""+label+"\"") {
			continue
		}
		v, _ := strconv.ParseFloat(strings.TrimSpace(val), 64)
		return v
	}
	return 0
}

// boltTxID reads the ID of the last committed write transaction of the
// bbolt file at path from its two meta pages (the larger txid; bbolt
// writes the meta of each commit to page txid%2), without opening it
// (the controller holds its lock). bbolt's meta layout: a 16-byte page
// header, then magic, version, pageSize, flags (uint32 each), the root
// bucket (16 bytes), freelist and high-water page IDs, txid (uint64s,
// little-endian on amd64 and arm64). 0 when unreadable.
func boltTxID(path string) int64 {
	f, err := os.Open(path)
	if err != nil {
		return 0
	}
	defer f.Close()
	hdr := make([]byte, 72)
	if _, err := f.ReadAt(hdr, 0); err != nil {
		return 0
	}
	pageSize := int64(binary.LittleEndian.Uint32(hdr[24:]))
	best := int64(binary.LittleEndian.Uint64(hdr[64:]))
	if _, err := f.ReadAt(hdr, pageSize); err == nil {
		best = max(best, int64(binary.LittleEndian.Uint64(hdr[64:])))
	}
	return best
}

// allowed is a log warning the bench expects, with the reason.
type allowed struct {
	match  string // a substring of the line
	reason string
}

// controllerAllowed are the controller warnings a bench run may log; any
// other WARN or ERROR line fails the run.
var controllerAllowed = []allowed{
	{"secrets are stored unsealed", "the bench sets no master key (MACHINA_API_KEY_MASTER_KEY): its throwaway state holds only the lab's BMC credentials"},
}

// logScan is what scanLog found in a log.
type logScan struct {
	warns, errs int            // WARN and ERROR lines not allowed
	allowed     map[string]int // allowed[match]: lines it allowed
	unexpected  []string       // the lines not allowed
}

// scanLog reads a text-handler slog log (up to now: the controller is
// still running) and sorts its WARN and ERROR lines into allowed (by allow)
// and unexpected. A missing log is an error.
func scanLog(path string, allow []allowed) (logScan, error) {
	out := logScan{allowed: map[string]int{}}
	f, err := os.Open(path)
	if err != nil {
		return out, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
lines:
	for sc.Scan() {
		l := sc.Text()
		warn, isErr := strings.Contains(l, "level=WARN"), strings.Contains(l, "level=ERROR")
		if !warn && !isErr {
			continue
		}
		for _, a := range allow {
			if warn && strings.Contains(l, a.match) {
				out.allowed[a.match]++
				continue lines
			}
		}
		if isErr {
			out.errs++
		} else {
			out.warns++
		}
		out.unexpected = append(out.unexpected, filepath.Base(path)+": "+l)
	}
	return out, sc.Err()
}

// running holds the `machina serve` children this bench started and has
// not yet waited for, and the temporary folders to remove if it is
// stopped by a signal.
var running = &children{pids: map[int]bool{}, dirs: map[string]bool{}}

// children is a set of started child processes (by PID) and folders.
type children struct {
	mu       sync.Mutex
	pids     map[int]bool
	dirs     map[string]bool
	stopping bool // stop began: the process exits when it ends
	// work counts this process's own writers into the recorded folders
	// (the simulated lab's set-up, writing each machine's tree), cancel
	// their context: stop cancels them and waits for them before it
	// removes the folders, which they would otherwise create again.
	work   sync.WaitGroup
	cancel []context.CancelFunc
}

// inProcess runs fn, a writer into the recorded folders in this process,
// with a context that stop cancels (and that ends with ctx: what fn
// starts under it, the simulated lab, lives on after fn returns); stop
// waits (up to its grace) for fn to return before it removes the folders.
func (c *children) inProcess(ctx context.Context, fn func(context.Context) error) error {
	ctx, cancel := context.WithCancel(ctx)
	c.mu.Lock()
	if c.stopping {
		c.mu.Unlock()
		cancel()
		return context.Canceled
	}
	c.cancel = append(c.cancel, cancel)
	c.work.Add(1)
	c.mu.Unlock()
	defer c.work.Done()
	return fn(ctx)
}

// start starts cmd and records its PID until wait.
func (c *children) start(cmd *exec.Cmd) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := cmd.Start(); err != nil {
		return err
	}
	c.pids[cmd.Process.Pid] = true
	return nil
}

// wait waits for cmd (started by start) and forgets its PID. A child
// that stop ended does not return here: the signal handler exits the
// process when stop is done, and the measurement must not go on (nor
// exit first with its own status) meanwhile.
func (c *children) wait(cmd *exec.Cmd) error {
	err := cmd.Wait()
	c.mu.Lock()
	delete(c.pids, cmd.Process.Pid)
	stopping := c.stopping
	c.mu.Unlock()
	if stopping {
		select {}
	}
	return err
}

// removeAtExit records dir for stop to remove; removed forgets it.
func (c *children) removeAtExit(dir string) {
	c.mu.Lock()
	c.dirs[dir] = true
	c.mu.Unlock()
}

func (c *children) removed(dir string) {
	c.mu.Lock()
	delete(c.dirs, dir)
	c.mu.Unlock()
}

// stop sends SIGTERM to every recorded child by its PID (machina serve
// stops on it as on SIGINT: writing its profiles, closing its state
// store), waits up to grace for each to exit, SIGKILLs those still
// running, and then removes the recorded folders (the state file and the
// simulated lab's trees, which the children may have been writing).
func (c *children) stop(grace time.Duration) {
	c.mu.Lock()
	c.stopping = true
	for _, cancel := range c.cancel {
		cancel()
	}
	c.mu.Unlock()
	writers := make(chan struct{})
	go func() { c.work.Wait(); close(writers) }()
	select {
	case <-writers:
	case <-time.After(grace):
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for pid := range c.pids {
		_ = syscall.Kill(pid, syscall.SIGTERM)
	}
	deadline := time.Now().Add(grace)
	for pid := range c.pids {
		for alive(pid) && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		if alive(pid) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	for dir := range c.dirs {
		_ = os.RemoveAll(dir)
	}
}

// alive reports whether process pid exists and has not exited: a child
// that exited but that nobody has waited for yet is a zombie (state Z in
// /proc/PID/stat), which kill(pid, 0) still finds.
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(b, ')')
	return i < 0 || i+2 >= len(b) || (b[i+2] != 'Z' && b[i+2] != 'X')
}

// stopOnSignal stops c's children (c.stop(grace)) and exits with status
// 128+signal when this process gets one of sigs: without it an
// interrupted bench left its controller running, holding the state file
// and its ports.
func stopOnSignal(c *children, grace time.Duration, sigs ...os.Signal) {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, sigs...)
	go func() {
		s := <-ch
		fmt.Fprintf(os.Stderr, "scale: %v: stopping the controller\n", s)
		c.stop(grace)
		code := 1
		if n, ok := s.(syscall.Signal); ok {
			code = 128 + int(n)
		}
		os.Exit(code)
	}()
}
