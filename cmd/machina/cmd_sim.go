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
	"github.com/machina-metal/machina/lab/sim"
	"github.com/machina-metal/machina/reconciler"
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
new → commissioning → ready → deployed. Ctrl-C stops everything.

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
	dir := o.dir
	if dir == "" {
		d, err := os.MkdirTemp("", "machina-sim-")
		if err != nil {
			return err
		}
		dir = d
	}
	dir, _ = filepath.Abs(dir)
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

	fmt.Fprintf(e.stdout, "Machina simulated lab in %s\n", dir)
	if restarted {
		fmt.Fprintf(e.stdout, "  restarted on a folder an earlier run used: the lab and the controller state start fresh (the previous state is in %s)\n",
			filepath.Join(dir, "state.db.previous"))
	}
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
	fmt.Fprintf(e.stdout, "  %d simulated servers behind simulated BMCs (bmcsim Redfish with vendor trees from the fixtures; OpenIPMI's ipmi_sim for the IPMI ones when installed)\n", len(lab.Machines()))
	fmt.Fprintf(e.stdout, "  inventory repository: %s\n  your working clone:   %s\n  image mirror:         %s\n  controller log:       %s\n\n",
		strings.TrimPrefix(lab.RepoURL, "file://"), lab.Clone, lab.MirrorURL, logPath)

	var (
		runMu sync.Mutex
		run   *controller.Running
	)
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- controller.Run(ctx, controller.Config{
			StatePath: filepath.Join(dir, "state.db"), WorkDir: filepath.Join(dir, "work"), Listen: o.listen, JoinListen: "127.0.0.1:0",
			Repo: reconciler.Remote{URL: lab.RepoURL}, PollInterval: o.pollInterval, StatusInterval: 3 * time.Second,
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
		return fmt.Errorf("controller: %w", err)
	}
	runMu.Lock()
	r := run
	runMu.Unlock()
	tokenPath := filepath.Join(dir, "admin-token")
	if tok, _, err := r.Store.CreateAdminToken("sim", state.ActorLocal); err == nil {
		_ = os.WriteFile(tokenPath, []byte(tok+"\n"), 0o600)
	}
	fmt.Fprintf(e.stdout, "Controller at %s (admin API token in %s)\n", r.URL, tokenPath)
	fmt.Fprintf(e.stdout, "Watching servers go new → commissioning → ready → deployed...\n\n")

	err = watchSim(ctx, e.stdout, r, o.untilDone, func() { printSimHelp(e.stdout, lab) })
	if errors.Is(err, errSimDone) {
		fmt.Fprintf(e.stdout, "\nEvery profile's count is deployed.\n")
		fctx, fcancel := context.WithTimeout(ctx, 30*time.Second)
		if err := r.FlushStatus(fctx); err != nil {
			fmt.Fprintf(e.stderr, "machina sim: final status commit: %v\n", err)
		}
		fcancel()
		printSimHelp(e.stdout, lab)
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

var errSimDone = errors.New("sim: done")

// watchSim prints every lifecycle move as it happens and a one-line
// summary when the counts change, until ctx ends (or, with untilDone,
// until every profile's count is deployed).
func watchSim(ctx context.Context, w io.Writer, r *controller.Running, untilDone bool, help func()) error {
	var after uint64
	lastSummary := ""
	joined := map[string]bool{}
	helped := false
	t := time.NewTicker(300 * time.Millisecond)
	defer t.Stop()
	for {
		evs, err := r.Store.Events(state.EventQuery{After: after, Limit: 1000})
		if err == nil {
			for _, ev := range evs {
				after = ev.Seq
				if ev.Kind == state.EventTransition {
					fmt.Fprintf(w, "  %s  %-8s %s → %s  %s\n", ev.At.Local().Format("15:04:05"), ev.Server, ev.From, ev.To, trim(ev.Message, 70))
				}
			}
		}
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

func trim(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-1] + "…"
}
