package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/machina-metal/machina/boot"
	"github.com/machina-metal/machina/controller"
	"github.com/machina-metal/machina/gitops"
	"github.com/machina-metal/machina/lab/sim"
	"github.com/machina-metal/machina/reconciler"
	"github.com/machina-metal/machina/reconciler/plan"
	"github.com/machina-metal/machina/state"
)

// simOptions are machina sim's flags.
type simOptions struct {
	dir          string
	servers      int
	bootDelay    time.Duration
	listen       string
	untilDone    bool
	timeout      time.Duration
	logFile      string
	pollInterval time.Duration
	keep         bool
}

// newSimCmd is `machina sim`: the controller against the simulated lab,
// the embedded default behind `make demo`.
func newSimCmd(e *env) *cobra.Command {
	var o simOptions
	cmd := &cobra.Command{
		Use:   "sim",
		Short: "Run the controller against a simulated lab (the embedded example site; loopback only, no root)",
		Long: `Run the whole controller against a simulated lab on 127.0.0.1: a local inventory
repository made from the embedded example site (a bare repository plus a working
clone), a simulated Redfish BMC per server serving a real vendor tree, simulated
machines that PXE-boot through the controller's real boot endpoints and run the
real ramdisk agent, and a local image mirror. Progress is printed as servers go
new → commissioning → ready → deployed, along with invalid inventory revisions,
plans held by the safety brake, failed and stalled actions. Ctrl-C stops
everything and removes the lab folder it created (--keep keeps it; a --dir you
name is always kept).

The inventory's IPMI servers get OpenIPMI's ipmi_sim (Debian package openipmi)
when it is in PATH; without it they run Redfish BMCs, their servers.yaml
entries say redfish, and the first lines printed name them.

The simulated BMCs serve the vendor Redfish trees of the repository's
testdata/fixtures: run it from the repository checkout (any folder inside
it), or set MACHINA_FIXTURES to that fixtures folder.

--dir may name a folder an earlier run used: the run starts fresh. The lab
(DIR/lab) is rebuilt, and the controller state starts empty, since the new
lab's machines, disks, BMC ports and repository history do not match the old
state: DIR/state.db is renamed DIR/state.db.previous and the controller's
clones and image store (DIR/work/git, DIR/work/images) are removed.
DIR/controller.log is appended to. A folder another machina sim is running on
is refused.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runSim(cmd.Context(), e, o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.dir, "dir", "", "folder for the lab (repository, state, images, disks); empty means a new folder under the system temp dir")
	f.IntVar(&o.servers, "servers", 0, "simulate this many generated servers instead of the example site (scale runs)")
	f.DurationVar(&o.bootDelay, "boot-delay", 2*time.Second, "simulated firmware time before each network boot")
	f.StringVar(&o.listen, "listen", "127.0.0.1:0", "controller HTTP address, HOST:PORT on loopback (127.0.0.1, ::1 or localhost); any other address is refused")
	f.BoolVar(&o.untilDone, "until-deployed", false, "exit 0 once every profile's count is deployed (CI smoke runs)")
	f.DurationVar(&o.timeout, "timeout", 0, "give up after this long (exit 1); zero means run until Ctrl-C")
	f.StringVar(&o.logFile, "log", "", "controller log file; empty means DIR/controller.log")
	f.DurationVar(&o.pollInterval, "poll", 2*time.Second, "how often the controller polls the inventory repository")
	f.BoolVar(&o.keep, "keep", false, "keep the lab folder machina sim created when it stops (a --dir is always kept)")
	return cmd
}

// checkLoopbackListen accepts a HOST:PORT whose host is a loopback IP
// (127.0.0.0/8, ::1) or "localhost": the simulated lab's controller serves
// an admin API and unauthenticated boot endpoints, and its help says
// loopback. An empty host (":8080"), 0.0.0.0, :: or any other address is
// refused.
func checkLoopbackListen(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("--listen %q: %w", addr, err)
	}
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return nil
	}
	what := host
	if host == "" {
		what = "an empty host (every interface)"
	}
	return fmt.Errorf("--listen %q: the simulated lab listens on loopback only (127.0.0.1, ::1 or localhost), not %s", addr, what)
}

// resetSimDir prepares a folder an earlier machina sim used for a fresh
// run and reports whether it was one (DIR/state.db exists): it renames
// state.db to state.db.previous and removes the controller's generated
// DIR/work/git and DIR/work/images; the lab's own subfolders are rebuilt by
// sim.Start. Nothing else in dir is touched. A state.db another process
// holds (bbolt's flock) is refused.
func resetSimDir(dir string) (bool, error) {
	statePath := filepath.Join(dir, "state.db")
	f, err := os.OpenFile(statePath, os.O_RDWR, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("sim: earlier state: %w", err)
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		return false, fmt.Errorf("sim: %s is in use (another machina sim on %s?): %w", statePath, dir, err)
	}
	if err := os.Rename(statePath, statePath+".previous"); err != nil {
		return false, fmt.Errorf("sim: keep the earlier state: %w", err)
	}
	for _, sub := range []string{"git", "images"} {
		if err := os.RemoveAll(filepath.Join(dir, "work", sub)); err != nil {
			return false, fmt.Errorf("sim: remove the earlier controller's work/%s: %w", sub, err)
		}
	}
	return true, nil
}

func runSim(ctx context.Context, e *env, o simOptions) error {
	if err := checkLoopbackListen(o.listen); err != nil {
		return usageError{err}
	}
	dir, created, err := simDir(o.dir)
	if err != nil {
		return err
	}
	if created && !o.keep {
		// Registered first, so it runs last: after the controller and the
		// lab (deferred below) have stopped and closed their files.
		defer removeSimDir(e, dir)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	restarted, err := resetSimDir(dir)
	if err != nil {
		return err
	}
	logPath := o.logFile
	if logPath == "" {
		logPath = filepath.Join(dir, "controller.log")
	}
	lf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer lf.Close()
	log := slog.New(slog.NewTextHandler(lf, &slog.HandlerOptions{Level: slog.LevelInfo}))
	if o.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.timeout)
		defer cancel()
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	printSimIntro(e, dir, o, restarted)
	log.Info("machina sim starting", "dir", dir, "restarted", restarted)
	// The lab outlives the controller: on Ctrl-C the controller stops
	// first and logs out of BMCs (IPMI Close Session) that are still
	// there to answer; lab.Close (deferred) then stops the lab.
	labCtx, labCancel := context.WithCancel(context.WithoutCancel(ctx))
	defer labCancel()
	lab, err := sim.Start(labCtx, sim.Config{Dir: filepath.Join(dir, "lab"), Servers: o.servers, BootDelay: o.bootDelay, Logger: log.With("component", "sim")})
	if err != nil {
		return err
	}
	defer lab.Close()
	printSimBMCs(e.stdout, lab)
	fmt.Fprintf(e.stdout, "  inventory repository: %s\n  your working clone:   %s\n  image mirror:         %s\n  controller log:       %s\n\n",
		strings.TrimPrefix(lab.RepoURL, "file://"), lab.Clone, lab.MirrorURL, logPath)

	r, done, err := startSimController(ctx, dir, o, lab, log)
	if err != nil {
		return err
	}
	tokenPath := filepath.Join(dir, "admin-token")
	if tok, _, err := r.Store.CreateAdminToken("sim", state.ActorLocal); err == nil {
		_ = os.WriteFile(tokenPath, []byte(tok+"\n"), 0o600)
	}
	export := printSimAccess(e.stdout, r.URL, tokenPath, lab, dir, created && !o.keep)
	fmt.Fprintf(e.stdout, "Watching servers go new → commissioning → ready → deployed (and invalid revisions, held plans, failed and stalled actions)...\n\n")

	help := func() {
		printSimHelp(e.stdout, lab)
		used, _ := dirSize(dir)
		fmt.Fprintf(e.stdout, "Talk to the controller (another terminal):\n  %s\n  machinactl status\nLab folder %s: %s on disk.\n", export, dir, humanBytes(used))
	}
	return watchThenStopSim(ctx, e, r, o, done, help, cancel, logPath)
}

// watchThenStopSim prints the lab's moves until it is done (every count
// deployed, with -until-done), interrupted or timed out; then it writes a
// last status commit (when done), stops the controller (cancel) and waits
// for it (done).
func watchThenStopSim(ctx context.Context, e *env, r *controller.Running, o simOptions, done <-chan error, help func(), cancel context.CancelFunc, logPath string) error {
	err := watchSim(ctx, e.stdout, r, o.untilDone, help)
	if errors.Is(err, errSimDone) {
		fmt.Fprintf(e.stdout, "\nEvery profile's count is deployed.\n")
		fctx, fcancel := context.WithTimeout(ctx, 30*time.Second)
		if err := r.FlushStatus(fctx); err != nil {
			fmt.Fprintf(e.stderr, "machina sim: final status commit: %v\n", err)
		}
		fcancel()
		help()
		cancel()
		<-done
		return nil
	}
	cancel()
	cerr := <-done
	if ctx.Err() != nil && o.timeout > 0 && errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("sim: not done within %s (see %s)", o.timeout, logPath)
	}
	fmt.Fprintln(e.stdout, "\nStopped.")
	return cerr
}

// simDir is the lab folder: dir made absolute, or a new temporary folder
// (created true) when dir is empty.
func simDir(dir string) (string, bool, error) {
	created := false
	if dir == "" {
		d, err := os.MkdirTemp("", "machina-sim-")
		if err != nil {
			return "", false, err
		}
		dir, created = d, true
	}
	dir, _ = filepath.Abs(dir)
	return dir, created, nil
}

// removeSimDir removes a lab folder runSim created and says how much it
// held.
func removeSimDir(e *env, dir string) {
	used, _ := dirSize(dir)
	if err := os.RemoveAll(dir); err != nil {
		fmt.Fprintf(e.stderr, "machina sim: remove %s: %v\n", dir, err)
		return
	}
	fmt.Fprintf(e.stdout, "Removed the lab folder %s (%s).\n", dir, humanBytes(used))
}

// printSimIntro prints the lab's first lines: its folder, the IPMI
// fallback warning and whether an earlier run's folder was reused.
func printSimIntro(e *env, dir string, o simOptions, restarted bool) {
	fmt.Fprintf(e.stdout, "Machina simulated lab in %s\n", dir)
	if o.servers == 0 && !sim.IPMIAvailable() {
		fmt.Fprintf(e.stdout, "  WARNING: %s: the example's IPMI servers will run simulated Redfish BMCs\n"+
			"  instead (named below; their servers.yaml entries say redfish), and `machinactl console` on them\n"+
			"  answers 501 (Serial-over-LAN needs IPMI). Install it for the IPMI path: apt-get install openipmi ipmitool\n"+
			"  (make demo does, as root).\n", sim.IPMIMissing)
	}
	if restarted {
		fmt.Fprintf(e.stdout, "  restarted on a folder an earlier run used: the lab and the controller state start fresh (the previous state is in %s)\n",
			filepath.Join(dir, "state.db.previous"))
	}
}

// startSimController runs the controller on the lab in the background and
// waits until it is ready (the lab's BMC credentials stored, the lab told
// its URL). done receives controller.Run's result when it returns.
func startSimController(ctx context.Context, dir string, o simOptions, lab *sim.Lab, log *slog.Logger) (*controller.Running, <-chan error, error) {
	var (
		runMu sync.Mutex
		run   *controller.Running
	)
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- controller.Run(ctx, controller.Config{
			StatePath: filepath.Join(dir, "state.db"), WorkDir: filepath.Join(dir, "work"), Listen: o.listen, JoinListen: "127.0.0.1:0",
			Repo: gitops.Remote{URL: lab.RepoURL}, PollInterval: o.pollInterval, StatusInterval: 3 * time.Second,
			// The BMC sweep reads power and health every 20 s (the first after 2 s),
			// so the web console's health column fills while the demo runs.
			BMCWatchInterval: 20 * time.Second,
			MachinePerIP:     boot.Limit{Burst: 10000, Every: time.Millisecond},
			MaxConnsPerIP:    1 << 20, // every simulated machine is 127.0.0.1
			Reconciler:       reconciler.Config{Interval: time.Second, BackoffBase: time.Second, BackoffCap: 30 * time.Second, Workers: 16, PerRack: 16},
			Logger:           log.With("component", "controller"),
			OnReady: func(r *controller.Running) {
				user, pass := lab.Credentials()
				for _, name := range []string{"bmc-redfish", "bmc-ipmi"} {
					if _, err := r.Store.PutSecret(name, state.Credential{Username: user, Password: pass}, state.ActorLocal); err != nil {
						log.Error("store simulated BMC credential", "err", err)
					}
				}
				lab.SetController(r.URL)
				runMu.Lock()
				run = r
				runMu.Unlock()
				close(ready)
			},
		})
	}()
	select {
	case <-ready:
	case err := <-done:
		return nil, nil, fmt.Errorf("controller: %w", err)
	}
	runMu.Lock()
	defer runMu.Unlock()
	return run, done, nil
}

var errSimDone = errors.New("sim: done")

// watchSim prints every lifecycle move as it happens, what needs an
// operator's eye (an invalid inventory revision and its errors, a plan the
// safety brake holds, failed and stalled actions, refused machine tokens,
// unreadable BMCs, approvals) and a one-line summary when the counts change,
// until ctx ends (or, with untilDone, until every profile's count is
// deployed).
func watchSim(ctx context.Context, w io.Writer, r *controller.Running, untilDone bool, help func()) error {
	var after uint64
	lastSummary := ""
	joined := map[string]bool{}
	helped := false
	var seen simAlerts
	t := time.NewTicker(300 * time.Millisecond)
	defer t.Stop()
	for {
		evs, err := r.Store.Events(state.EventQuery{After: after, Limit: 1000})
		if err == nil {
			for _, ev := range evs {
				after = ev.Seq
				seen.event(w, ev)
			}
		}
		good, invalid := r.Source.Latest()
		seen.revision(w, good, invalid)
		seen.plan(w, r.Reconciler.LastPlan())
		if hosts, err := r.Store.Hosts(); err == nil {
			for _, h := range hosts {
				if h.JoinStatus == "joined" && !joined[h.Name] {
					joined[h.Name] = true
					fmt.Fprintf(w, "  %s  %-8s joined the fleet over pinned TLS (site %s, tags %s; networks %s; pools %s)\n",
						time.Now().Format("15:04:05"), h.Name, h.Site, strings.Join(h.Tags, ","), strings.Join(h.Networks, ","), strings.Join(h.StoragePools, ","))
				}
			}
		}
		snap, err := r.Store.Snapshot()
		if err == nil {
			if s := summary(snap); s != lastSummary {
				fmt.Fprintf(w, "  -- %s\n", s)
				lastSummary = s
			}
			if deployedAll(r, snap) && allJoined(snap, joined) {
				if untilDone {
					return errSimDone
				}
				if !helped {
					fmt.Fprintf(w, "\nEvery profile's count is deployed. The lab keeps running (Ctrl-C stops it).\n")
					help()
					helped = true
				}
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// simAlerts remembers what watchSim printed, so each invalid revision, held
// plan and repeated failure is printed once.
type simAlerts struct {
	invalid    string            // commit of the invalid revision printed
	brake      string            // the held plan's brake message printed
	lastFailed map[string]string // server → last failed-action message printed
}

// event prints one store event if it is a lifecycle move or needs an eye.
func (a *simAlerts) event(w io.Writer, ev state.Event) {
	at := ev.At.Local().Format("15:04:05")
	switch ev.Kind {
	case state.EventTransition:
		fmt.Fprintf(w, "  %s  %-8s %s → %s  %s\n", at, ev.Server, ev.From, ev.To, trim(ev.Message, 70))
	case "action.stalled":
		fmt.Fprintf(w, "  %s  %-8s STALLED  %s (not retried until its desired state or counter changes, or its credential is set; machinactl status)\n", at, ev.Server, trim(ev.Message, 90))
	case "action.failed":
		if a.lastFailed == nil {
			a.lastFailed = map[string]string{}
		}
		if a.lastFailed[ev.Server] != ev.Message {
			a.lastFailed[ev.Server] = ev.Message
			fmt.Fprintf(w, "  %s  %-8s failed   %s (retried with backoff)\n", at, ev.Server, trim(ev.Message, 90))
		}
	case state.EventUnstalled:
		fmt.Fprintf(w, "  %s  %-8s unstalled  %s\n", at, ev.Server, trim(ev.Message, 90))
	case state.EventApproval:
		fmt.Fprintf(w, "  %s  approved by %s: %s\n", at, ev.Actor, trim(ev.Message, 90))
	case state.EventTokenRefused:
		fmt.Fprintf(w, "  %s  %-8s machine token refused: %s\n", at, ev.Server, trim(ev.Message, 90))
	case state.EventBMCRead:
		fmt.Fprintf(w, "  %s  %-8s BMC read: %s\n", at, ev.Server, trim(ev.Message, 90))
	}
}

// revision prints an invalid newest inventory revision once, with its
// errors, and when the branch is valid again.
func (a *simAlerts) revision(w io.Writer, good gitops.Revision, invalid *gitops.InvalidRevision) {
	now := time.Now().Format("15:04:05")
	switch {
	case invalid != nil && invalid.Commit != a.invalid:
		a.invalid = invalid.Commit
		fmt.Fprintf(w, "  %s  INVALID inventory revision %s: the controller keeps acting on %s and starts no deploy until it is fixed:\n",
			now, short(invalid.Commit), orNone(short(good.Commit)))
		for i, fe := range invalid.Errors {
			if i == 5 {
				fmt.Fprintf(w, "              ... and %d more (machinactl validate in your clone)\n", len(invalid.Errors)-5)
				break
			}
			fmt.Fprintf(w, "              %s\n", trim(fe.Error(), 110))
		}
	case invalid == nil && a.invalid != "":
		a.invalid = ""
		fmt.Fprintf(w, "  %s  inventory valid again at %s\n", now, short(good.Commit))
	}
}

// plan prints a plan the safety brake holds once, and when it is released.
func (a *simAlerts) plan(w io.Writer, res plan.Result) {
	now := time.Now().Format("15:04:05")
	switch {
	case res.Brake != "" && res.Brake != a.brake:
		a.brake = res.Brake
		fmt.Fprintf(w, "  %s  HELD plan: %d steps wait: %s\n", now, len(res.Held), trim(res.Brake, 140))
	case res.Brake == "" && a.brake != "":
		a.brake = ""
		fmt.Fprintf(w, "  %s  plan no longer held\n", now)
	}
}

func short(commit string) string {
	if len(commit) > 12 {
		return commit[:12]
	}
	return commit
}

func orNone(s string) string {
	if s == "" {
		return "no earlier valid revision"
	}
	return s
}

// deployedAll reports whether the acting plan has nothing left to do and
// every profile's count is deployed.
func deployedAll(r *controller.Running, snap state.Snapshot) bool {
	inv := r.Reconciler.Desired()
	if inv == nil {
		return false
	}
	got := map[string]int{}
	for _, s := range snap.Servers {
		if s.Lifecycle == state.LifecycleDeployed && !s.FinishDeploy && s.Allocation != nil {
			got[s.Allocation.Profile]++
		}
	}
	for _, p := range inv.Profiles {
		if got[p.Name] < p.Count {
			return false
		}
	}
	return true
}

// allJoined reports whether every deployed server's host has joined.
func allJoined(snap state.Snapshot, joined map[string]bool) bool {
	for name, s := range snap.Servers {
		if s.Lifecycle == state.LifecycleDeployed && !joined[name] {
			return false
		}
	}
	return true
}

func summary(snap state.Snapshot) string {
	counts := map[state.Lifecycle]int{}
	for _, s := range snap.Servers {
		counts[s.Lifecycle]++
	}
	var parts []string
	for _, lc := range state.Lifecycles() {
		if counts[lc] > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", lc, counts[lc]))
		}
	}
	sort.Strings(parts)
	return strings.Join(parts, ", ")
}

func printSimHelp(w io.Writer, lab *sim.Lab) {
	fmt.Fprintf(w, `
Change the fleet the GitOps way, in your working clone:
  cd %s
  git pull                                  # the controller's status commits
  $EDITOR profiles.yaml                     # e.g. raise hypervisor's count
  git commit -am "more hypervisors" && git push
Read what the controller observed:
  git pull && cat status/README.md && git log --oneline
`, lab.Clone)
}

// printSimBMCs says which BMCs really run: how many Redfish (bmcsim) and
// IPMI (ipmi_sim), and the servers the inventory gives IPMI that run
// Redfish here, with why.
func printSimBMCs(w io.Writer, lab *sim.Lab) {
	ipmi := lab.IPMIServers()
	n := len(lab.Machines())
	fmt.Fprintf(w, "  %d simulated servers: %d behind simulated Redfish BMCs (bmcsim, vendor trees from the fixtures), %d behind OpenIPMI's ipmi_sim%s\n",
		n, n-len(ipmi), len(ipmi), listOrEmpty(ipmi))
	fb := lab.RedfishFallbacks()
	if len(fb) == 0 {
		return
	}
	names := make([]string, 0, len(fb))
	why := ""
	for name, r := range fb {
		names = append(names, name)
		why = r
	}
	sort.Strings(names)
	fmt.Fprintf(w, "  Redfish-only here, IPMI in the example: %s (%s)\n", strings.Join(names, ", "), why)
}

func listOrEmpty(names []string) string {
	if len(names) == 0 {
		return ""
	}
	return " (" + strings.Join(names, ", ") + ")"
}

// printSimAccess prints the copy-paste lines to reach the controller with
// machinactl, the simulated BMCs' account, and the lab folder with its size
// and fate.
// It returns the export line.
func printSimAccess(w io.Writer, url, tokenPath string, lab *sim.Lab, dir string, removeOnExit bool) string {
	binDir := "bin"
	if exe, err := os.Executable(); err == nil {
		binDir = filepath.Dir(exe)
	}
	fmt.Fprintf(w, "Controller at %s. In another terminal (copy-paste):\n", url)
	export := fmt.Sprintf("export PATH=%s:$PATH MACHINA_API=%s MACHINA_TOKEN=$(cat %s)", binDir, url, tokenPath)
	fmt.Fprintf(w, "  %s\n", export)
	fmt.Fprintf(w, "  machinactl status                 # the fleet: lifecycles, held plan, failed and stalled servers\n")
	if ipmi := lab.IPMIServers(); len(ipmi) > 0 {
		fmt.Fprintf(w, "  machinactl console %-14s # an IPMI server's serial console (Serial-over-LAN)\n", ipmi[0])
	}
	fmt.Fprintf(w, "  web console: %s/ui/ (log in with the token above)\n", url)
	if _, err := os.Stat(filepath.Join(binDir, "machinactl")); err != nil {
		fmt.Fprintf(w, "  (no machinactl next to this machina in %s: make build puts both in bin/)\n", binDir)
	}
	user, pass := lab.Credentials()
	fmt.Fprintf(w, "Simulated BMCs (lab only, loopback): user %s, password %s\n", user, pass)
	used, _ := dirSize(dir)
	fate := "Ctrl-C stops the lab and removes this folder (machina sim --keep, or make demo DEMO_FLAGS=--keep, keeps it)"
	if !removeOnExit {
		fate = "it is kept when the lab stops; remove it yourself with rm -rf " + dir
	}
	fmt.Fprintf(w, "Lab folder %s: %s on disk now, more as images are written (the simulated disks are sparse files); %s\n\n", dir, humanBytes(used), fate)
	return export
}

// dirSize returns the disk space the files under dir use (allocated
// blocks; a sparse file counts what is written) and their apparent size.
func dirSize(dir string) (used, apparent int64) {
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return nil
		}
		apparent += fi.Size()
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			used += st.Blocks * 512
		} else {
			used += fi.Size()
		}
		return nil
	})
	return used, apparent
}

// humanBytes renders n as "12.3 MB" (SI units).
func humanBytes(n int64) string {
	switch {
	case n >= 1e9:
		return fmt.Sprintf("%.1f GB", float64(n)/1e9)
	case n >= 1e6:
		return fmt.Sprintf("%.1f MB", float64(n)/1e6)
	case n >= 1e3:
		return fmt.Sprintf("%.1f kB", float64(n)/1e3)
	}
	return fmt.Sprintf("%d B", n)
}

func trim(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-1] + "…"
}
