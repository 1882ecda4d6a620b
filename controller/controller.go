// Package controller wires Machina's components into the running
// controller: the state store, the admin API and machine-facing endpoints,
// the iPXE boot endpoints and the ramdisk files, the image store and its
// importer, the Git source, the reconciler and the status writer. It is
// what `machina serve` runs and what the simulated lab and the end-to-end
// tests start in-process.
//
// controller holds no logic of its own beyond wiring and small adapters;
// the rules live in the packages it connects.
package controller

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/machina-metal/machina/api"
	"github.com/machina-metal/machina/boot"
	"github.com/machina-metal/machina/boot/dhcp"
	"github.com/machina-metal/machina/boot/ipxe"
	"github.com/machina-metal/machina/fence"
	"github.com/machina-metal/machina/images"
	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/join"
	"github.com/machina-metal/machina/reconciler"
	"github.com/machina-metal/machina/state"
)

// Config configures the controller. Zero values are usable except
// StatePath, WorkDir and Repo.URL.
type Config struct {
	// StatePath is the bbolt state file. Required.
	StatePath string
	// MasterKey seals secrets (MACHINA_API_KEY_MASTER_KEY); nil stores them
	// unsealed, with a warning.
	MasterKey []byte
	// Listen is the HTTP address of the admin API, the boot endpoints and
	// the machine-facing endpoints; "" means 127.0.0.1:8080.
	Listen string
	// PublicURL is the controller's base URL as machines reach it (iPXE
	// scripts, deploy plans); "" means http://<Listen's bound address>.
	PublicURL string
	// WorkDir holds the Git clones (WorkDir/git) and, unless ImagesDir is
	// set, the image store (WorkDir/images). Required.
	WorkDir string
	// ImagesDir overrides the image store's folder.
	ImagesDir string
	// Mirrors re-roots catalog images at local mirrors.
	Mirrors images.Mirrors
	// AllowFileURLs lets images.yaml name file:// URLs (tests, the
	// simulated lab); off in production.
	AllowFileURLs bool
	// RamdiskDir holds vmlinuz and initrd.cpio.gz (make ramdisk), served at
	// /boot/ramdisk/ by boot/ipxe (through an os.Root: symlinks out of it are
	// refused); "" serves nothing there.
	RamdiskDir string
	// ISODir holds the iPXE ISOs (make ipxe-iso), served at /boot/iso/.
	ISODir string
	// Repo is the inventory repository.
	Repo reconciler.Remote
	// StatusBranch sends status commits to a separate branch.
	StatusBranch string
	// PollInterval is the Git poll interval; zero means 30 s.
	PollInterval time.Duration
	// StatusInterval is the least time between status commits; zero means 30 s.
	StatusInterval time.Duration
	// Reconciler tunes the executor (workers, limits, backoff, deadlines);
	// Store, Drivers, Logger and OnPass are filled here.
	Reconciler reconciler.Config
	// Drivers opens BMC drivers; nil uses the store's secrets (StoreDrivers).
	Drivers reconciler.Drivers
	// AdminTLS is the admin API and UI's TLS listener: off loopback they
	// answer only there, and Listen serves the machine-facing endpoints.
	// The zero value runs none on a loopback Listen.
	AdminTLS AdminTLS
	// JoinListen is the TLS join listener's address (install script,
	// POST /hosts/join, node heartbeats); "" means a free port on 127.0.0.1
	// (machina serve's --join-listen defaults to 127.0.0.1:8443).
	JoinListen string
	// JoinURL is the join listener's base URL as hosts reach it; "" means
	// https://<JoinListen's bound address>.
	JoinURL string
	// NodeBinary is the machina-node executable the install script fetches;
	// "" serves none (bundle installs only).
	NodeBinary string
	// JoinTokenTTL bounds a deploy's enrolment token; zero means 24 hours
	// (a deploy plus an OS first boot; the token is single-use).
	JoinTokenTTL time.Duration
	// Netboot runs DHCP, TFTP and the IPv6 RA on the provisioning segment;
	// the zero value runs none of them.
	Netboot NetbootConfig
	// MachinePerIP limits the boot and machine-facing requests per client IP;
	// zero means the packages' defaults (a burst of 20-30, 10 a second). The
	// simulated lab, where every machine is 127.0.0.1, raises it.
	MachinePerIP boot.Limit
	// MaxConnsPerIP caps the open connections of one source address on
	// the HTTP listener (admin API, UI, boot and machine endpoints); zero
	// means api.DefaultMaxConnsPerIP (256). The simulated lab, whose
	// machines all come from 127.0.0.1, raises it.
	MaxConnsPerIP int
	// AutoEnroll enrols machines that PXE-boot with a MAC no server has
	// (MACHINA_METAL_AUTO_ENROLL=1; off by default): each becomes a server
	// named auto-<MAC hex> with no BMC, is commissioned at once, and its
	// servers.yaml entry is pushed to a discovered/DATE branch for review.
	AutoEnroll bool
	// AutoEnrollZone is the zone of auto-enrolled servers; "" means
	// reconciler.DefaultEnrollZone ("discovered", which no profile selects
	// until a reviewer changes it).
	AutoEnrollZone string
	// AutoEnrollMax bounds the auto-enrolled servers pending review; zero
	// means reconciler.DefaultEnrollMax (16).
	AutoEnrollMax int
	// AutoEnrollCommitTo commits proposals straight onto this branch (it
	// must be Repo's branch); "" pushes review branches discovered/DATE.
	AutoEnrollCommitTo string
	// BMCWatchInterval is how long one sweep of every BMC's power state
	// and health rollup spans (reads paced evenly over it, the first sweep
	// a tenth of it after start, at most a minute); zero means
	// DefaultBMCWatchInterval (10 min), negative turns the sweep off.
	BMCWatchInterval time.Duration
	// Heartbeat is the interval joined hosts are told to heartbeat at, in
	// whole seconds (rounded, at least 1s); zero means 30s.
	Heartbeat time.Duration
	// HostLostWindow is the silence after which a host is marked lost
	// (condition HostLost, its power read from the BMC); zero means 3
	// heartbeat intervals.
	HostLostWindow time.Duration
	// HostFenceWindow is how much longer a lost host on a profile with
	// `fence: auto` stays lost before it is fenced; zero means
	// HostLostWindow again.
	HostFenceWindow time.Duration
	// FenceTimeout bounds one fence (power off and read-back); zero means 60s.
	FenceTimeout time.Duration
	// Logger receives every component's logs; nil discards.
	Logger *slog.Logger
	// OnReady is called once the HTTP listener accepts connections.
	OnReady func(r *Running)
}

// Running is a started controller, handed to OnReady.
type Running struct {
	// Addr is the HTTP listener's address.
	Addr net.Addr
	// URL is the controller's base URL as machines reach it.
	URL string
	// Store is the open state store.
	Store *state.Store
	// Reconciler is the executor (for Trigger, LastPlan, Desired).
	Reconciler *reconciler.Controller
	// Source is the Git source.
	Source *reconciler.Source
	// Status is the status writer.
	Status *reconciler.StatusWriter
	// Images is the image store.
	Images *images.Store
	// JoinURL is the join listener's base URL.
	JoinURL string
	// Routes are the route patterns of the HTTP listener's mux (API,
	// admin, machine-facing, boot, images, console and every UI route),
	// JoinRoutes those of the join listener (TLS), for tests and docs.
	Routes, JoinRoutes []string
	// AdminURL is the admin API's TLS base URL, "" when it has no TLS
	// listener (loopback: the admin API is on Addr).
	AdminURL string

	flush func(ctx context.Context) error
}

// FlushStatus builds the status of the fleet now and commits it at once,
// waiting for the push (the status writer otherwise batches commits).
func (r *Running) FlushStatus(ctx context.Context) error { return r.flush(ctx) }

// Run starts every component and serves until ctx is done, then stops them
// and returns nil. A component failing to start is returned at once.
func Run(ctx context.Context, cfg Config) error {
	if cfg.StatePath == "" || cfg.WorkDir == "" || cfg.Repo.URL == "" {
		return errors.New("controller: StatePath, WorkDir and Repo.URL are required")
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:8080"
	}
	if cfg.Heartbeat <= 0 {
		cfg.Heartbeat = 30 * time.Second
	}
	cfg.Heartbeat = max(time.Second, cfg.Heartbeat.Round(time.Second)) // nodes are told whole seconds
	if err := os.MkdirAll(cfg.WorkDir, 0o750); err != nil {
		return fmt.Errorf("controller: %w", err)
	}
	st, err := state.Open(cfg.StatePath, state.Options{MasterKey: cfg.MasterKey, Logger: log.With("component", "state")})
	if err != nil {
		return fmt.Errorf("controller: open state: %w", err)
	}
	defer st.Close()
	if sec, err := st.SecretsStatus(); err == nil && !sec.Sealing {
		if sec.Sealed > 0 {
			return fmt.Errorf("controller: the state file holds %d sealed secrets but no master key is set", sec.Sealed)
		}
		log.Warn("secrets are stored unsealed: set MACHINA_API_KEY_MASTER_KEY to encrypt them at rest")
	}

	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("controller: listen %s: %w", cfg.Listen, err)
	}
	defer ln.Close()
	publicURL := cfg.PublicURL
	if publicURL == "" {
		publicURL = "http://" + ln.Addr().String()
	}

	reg := prometheus.NewRegistry()
	srv, err := api.New(api.Config{Store: st, Logger: log.With("component", "api"), Registry: reg, MaxConnsPerIP: cfg.MaxConnsPerIP})
	if err != nil {
		return fmt.Errorf("controller: %w", err)
	}

	imagesDir := cfg.ImagesDir
	if imagesDir == "" {
		imagesDir = filepath.Join(cfg.WorkDir, "images")
	}
	imgStore, err := images.OpenStore(imagesDir)
	if err != nil {
		return fmt.Errorf("controller: image store: %w", err)
	}
	imgStatus := &imageStatus{m: map[string]images.Status{}}
	importFails := &importFailures{}
	importer, err := images.New(images.Config{Store: imgStore, Status: imgStatus, AllowFileURLs: cfg.AllowFileURLs, Logger: log.With("component", "images")})
	if err != nil {
		return fmt.Errorf("controller: %w", err)
	}
	imgHandler, err := images.NewHandler(images.HandlerConfig{Store: imgStore, Tokens: newImageTokens(st), Logger: log.With("component", "images")})
	if err != nil {
		return fmt.Errorf("controller: %w", err)
	}
	if err := srv.HandlePublic("/images/", imgHandler); err != nil {
		return err
	}

	drivers, sweepDrivers := cfg.Drivers, cfg.Drivers
	if drivers == nil {
		sd := &StoreDrivers{Store: st, Logger: log.With("component", "bmc")}
		// The BMC sweep reads every BMC in turn: with its own small cache
		// it does not evict the drivers (and BMC sessions) the reconciler
		// keeps for the servers it is working on.
		sw := &StoreDrivers{Store: st, Logger: log.With("component", "bmc-sweep"), MaxDrivers: 2 * bmcWatchWorkers, IdleTimeout: time.Minute}
		defer func() {
			// Logging out of every BMC is a courtesy (sessions also
			// expire on the BMC): bounded so Ctrl-C stops promptly.
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			var wg sync.WaitGroup
			for _, d := range []*StoreDrivers{sd, sw} {
				wg.Go(func() { d.Close(ctx) })
			}
			wg.Wait()
		}()
		drivers, sweepDrivers = sd, sw
	}
	status := &statusFeed{gap: statusBuildGap(cfg.StatusInterval)}
	rcfg := cfg.Reconciler
	rcfg.Store, rcfg.Drivers, rcfg.Logger = st, drivers, log.With("component", "reconciler")
	rcfg.Metrics = reconciler.NewMetrics(reg)
	if cfg.ISODir != "" {
		// The names scripts/metal/build-ipxe-iso.sh writes; the reconciler
		// picks one by the server's bootMode.
		if rcfg.ISOURL == "" {
			rcfg.ISOURL = publicURL + "/boot/iso/machina-ipxe-bios.iso"
		}
		if rcfg.UEFIISOURL == "" {
			rcfg.UEFIISOURL = publicURL + "/boot/iso/machina-ipxe-uefi.iso"
		}
	}
	rcfg.OnPass = status.onPass
	if rcfg.DeployReady == nil {
		rcfg.DeployReady = func(p inventory.Profile) error {
			if kind, ok := installerKind(string(p.Deploy)); ok {
				// The installer boots from its ISO's kernel and initrd,
				// extracted after the import (follow).
				if _, err := imgStore.InstallerReady(p.Image, kind); err != nil {
					return fmt.Errorf("installer image %s: %w", p.Image, err)
				}
				return nil
			}
			rec, err := imgStore.Lookup(p.Image)
			if err == nil && rec.State == images.StateVerified {
				return nil
			}
			if ierr := importFails.reason(p.Image); ierr != nil {
				return fmt.Errorf("image %s: %w", p.Image, ierr)
			}
			if err != nil {
				return fmt.Errorf("image %s: %w", p.Image, err)
			}
			return fmt.Errorf("image %s is %s, not verified yet", p.Image, rec.State)
		}
	}
	ctrl, err := reconciler.New(rcfg)
	if err != nil {
		return fmt.Errorf("controller: %w", err)
	}

	idx, err := api.NewBootIndex(st)
	if err != nil {
		return fmt.Errorf("controller: %w", err)
	}
	refusals, err := newRefusalSummary(st, reg)
	if err != nil {
		return fmt.Errorf("controller: %w", err)
	}
	ipxeCfg := ipxe.Config{Lookup: idx, Tokens: idx, ControllerURL: publicURL, ISODir: cfg.ISODir, RamdiskDir: cfg.RamdiskDir, Logger: log.With("component", "ipxe"), PerIP: cfg.MachinePerIP,
		OnEvent: refusals.event}
	gitDir := filepath.Join(cfg.WorkDir, "git")
	var enr *reconciler.Enroller
	if cfg.AutoEnroll {
		prop, err := reconciler.NewProposer(reconciler.ProposerConfig{Remote: cfg.Repo, StateDir: gitDir, CommitTo: cfg.AutoEnrollCommitTo,
			Logger: log.With("component", "auto-enrol")})
		if err != nil {
			return fmt.Errorf("controller: %w", err)
		}
		enr, err = reconciler.NewEnroller(reconciler.EnrollConfig{Store: st, Desired: ctrl.Desired, Zone: cfg.AutoEnrollZone, Max: cfg.AutoEnrollMax,
			Proposer: prop, OnEnrolled: func(string) { ctrl.Trigger() }, Logger: log.With("component", "auto-enrol")})
		if err != nil {
			return fmt.Errorf("controller: %w", err)
		}
		ipxeCfg.AutoEnroll, ipxeCfg.Enroller = true, enr
		zone, maxPending := cfg.AutoEnrollZone, cfg.AutoEnrollMax
		if zone == "" {
			zone = reconciler.DefaultEnrollZone
		}
		if maxPending <= 0 {
			maxPending = reconciler.DefaultEnrollMax
		}
		log.Warn("auto-enrol is on: any machine that PXE-boots on the provisioning network is commissioned and proposed into Git",
			"zone", zone, "max_pending", maxPending)
	}
	var enrHook boot.Enroller
	if enr != nil {
		enrHook = enr
	}
	// In full DHCP mode the controller knows each MAC's address: plans,
	// reports, done and joins are refused from any other.
	// The leases are kept in the state file (controller/leases.go): the
	// check holds across a restart.
	var leases *stateLeases
	if len(cfg.Netboot.Interfaces) > 0 && cfg.Netboot.Mode != dhcp.ModeProxy {
		leases = &stateLeases{st: st}
	}
	netRuns, err := startNetboot(cfg.Netboot, idx, publicURL, cfg.AutoEnroll, enrHook, leases, log)
	if err != nil {
		return fmt.Errorf("controller: %w", err)
	}
	bootHandler, err := ipxe.New(ipxeCfg)
	if err != nil {
		return fmt.Errorf("controller: %w", err)
	}
	defer bootHandler.Close()
	if err := srv.HandlePublic(ipxe.ScriptPath, bootHandler); err != nil {
		return err
	}
	if err := srv.HandlePublic(boot.GRUBScriptPath, bootHandler); err != nil { // arm64 machines (docs/arm64.md)
		return err
	}
	if cfg.ISODir != "" {
		if err := srv.HandlePublic("/boot/iso/", bootHandler); err != nil {
			return err
		}
	}
	if cfg.RamdiskDir != "" {
		if err := srv.HandlePublic("/boot/ramdisk/", bootHandler); err != nil {
			return err
		}
	}
	// The join listener: its own TLS port, certificate signed by the
	// controller CA (made on first start, key sealed in the store).
	ca, err := join.LoadOrCreateCA(st, nil)
	if err != nil {
		return fmt.Errorf("controller: join CA: %w", err)
	}
	adminLn, adminURL, err := ListenAdminTLS(cfg.Listen, cfg.AdminTLS, ca)
	if err != nil {
		return fmt.Errorf("controller: %w", err)
	}
	if adminLn != nil {
		defer adminLn.Close()
		srv.SetAdminURL(adminURL)
	}
	if cfg.JoinListen == "" {
		cfg.JoinListen = "127.0.0.1:0"
	}
	joinLn, err := net.Listen("tcp", cfg.JoinListen)
	if err != nil {
		return fmt.Errorf("controller: join listen %s: %w", cfg.JoinListen, err)
	}
	defer joinLn.Close()
	joinURL := cfg.JoinURL
	if joinURL == "" {
		joinURL = "https://" + joinLn.Addr().String()
	}
	var joinLeases func(server string) (netip.Addr, bool)
	var machineLeases api.LeaseLookup
	if leases != nil {
		machineLeases = leases
		joinLeases = func(server string) (netip.Addr, bool) {
			s, err := st.Server(server)
			if err != nil || s.BootMAC == "" {
				return netip.Addr{}, false
			}
			return leases.LeasedIP(s.BootMAC)
		}
	}
	joinSrv, err := join.New(join.Config{Store: st, CA: ca, URL: joinURL, NodeBinary: cfg.NodeBinary, Heartbeat: cfg.Heartbeat, LeasedIP: joinLeases, Logger: log.With("component", "join")})
	if err != nil {
		return fmt.Errorf("controller: %w", err)
	}
	if err := join.RegisterAdmin(srv, joinSrv, api.Actor); err != nil {
		return err
	}
	if cfg.JoinTokenTTL <= 0 {
		cfg.JoinTokenTTL = 24 * time.Hour
	}
	jc := joinCommander{srv: joinSrv, desired: ctrl.Desired, ttl: cfg.JoinTokenTTL}
	pl := &planner{desired: ctrl.Desired, images: imgStore, baseURL: publicURL, join: jc, store: st, log: log.With("component", "planner")}
	machine, err := api.NewMachine(api.MachineConfig{Store: st, Planner: pl, Wiper: pl, Installer: pl,
		PerIP: cfg.MachinePerIP, Leases: machineLeases, Logger: log.With("component", "machine")})
	if err != nil {
		return fmt.Errorf("controller: %w", err)
	}
	if err := machine.Mount(srv); err != nil {
		return err
	}

	src, err := reconciler.NewSource(reconciler.SourceConfig{Remote: cfg.Repo, StateDir: gitDir, Interval: cfg.PollInterval, Logger: log.With("component", "git"),
		OnEvent: func(e reconciler.SourceEvent) {
			_, _ = st.AppendEvent(state.Event{Kind: state.EventKind("inventory." + string(e.Kind)), Message: e.Message})
		}})
	if err != nil {
		return fmt.Errorf("controller: %w", err)
	}
	writer, err := reconciler.NewStatusWriter(reconciler.StatusConfig{Remote: cfg.Repo, StatusBranch: cfg.StatusBranch, StateDir: gitDir,
		Interval: cfg.StatusInterval, Logger: log.With("component", "status")})
	if err != nil {
		return fmt.Errorf("controller: %w", err)
	}
	builder := &reconciler.StatusBuilder{Store: st}
	var urg statusUrgency
	status.build = func(res reconciler.Result) {
		// The snapshot is built by the writer when it writes (see
		// UpdateFrom): a 10,000-server snapshot is tens of MB, and a build
		// per pass would mostly be garbage.
		stalled, err := st.StalledServers()
		if err != nil {
			log.Error("status: stalled servers", "err", err)
		}
		urgent := urg.check(src.InventoryStatus().Invalid, stalled)
		writer.UpdateFrom(func() (reconciler.Snapshot, error) {
			return builder.Build(src.InventoryStatus(), imgStatus.list(), res)
		}, urgent)
	}
	if err := mountAdmin(srv, st, ctrl, src, scanProposers(cfg.Repo, gitDir, log.With("component", "scan")), cfg.Repo.Branch); err != nil {
		return err
	}
	fencer := &fencer{st: st, drivers: drivers, desired: ctrl.Desired, opts: fence.Options{Timeout: cfg.FenceTimeout}, log: log.With("component", "fence")}
	if err := mountHosts(srv, st, fencer, ctrl.Trigger, cfg.Heartbeat); err != nil {
		return err
	}
	if err := mountImages(srv, ctrl, imgStore, imgStatus, importFails); err != nil {
		return err
	}
	uiRoutes, err := mountConsoleAndUI(srv, st, drivers, src, ctrl, imgStatus, gitDir, log)
	if err != nil {
		return fmt.Errorf("controller: console and UI: %w", err)
	}

	var routes []string
	for _, p := range srv.Routes() {
		if p == uiPrefix {
			routes = append(routes, uiRoutes...) // the UI's own routes instead of its prefix
			continue
		}
		routes = append(routes, p)
	}
	run := &Running{Addr: ln.Addr(), URL: publicURL, Store: st, Reconciler: ctrl, Source: src, Status: writer, Images: imgStore, JoinURL: joinURL, AdminURL: adminURL,
		Routes: routes, JoinRoutes: joinSrv.Routes(),
		flush: func(ctx context.Context) error {
			// Hand the snapshot to the writer's own loop (urgent) and wait
			// for its next successful write: calling Write here would race
			// with the loop on the same clone.
			plan := ctrl.LastPlan()
			since := time.Now()
			writer.UpdateFrom(func() (reconciler.Snapshot, error) {
				return builder.Build(src.InventoryStatus(), imgStatus.list(), plan)
			}, true)
			for {
				h := writer.Health()
				if h.LastSuccess.After(since) {
					return nil
				}
				select {
				case <-ctx.Done():
					return fmt.Errorf("status flush: %w (last error: %s)", ctx.Err(), h.LastError)
				case <-time.After(50 * time.Millisecond):
				}
			}
		}}
	log.Info("controller listening", "addr", ln.Addr().String(), "url", publicURL, "repo", redactURL(cfg.Repo.URL))

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errc := make(chan error, 8)
	goRun := func(name string, f func(context.Context) error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(ctx); err != nil && !errors.Is(err, context.Canceled) {
				errc <- fmt.Errorf("%s: %w", name, err)
				cancel()
			}
		}()
	}
	if adminLn != nil && !IsLoopback(ln.Addr().String()) {
		goRun("machine endpoints", func(ctx context.Context) error { return srv.ServeMachine(ctx, ln) })
	} else {
		goRun("api", func(ctx context.Context) error { return srv.Serve(ctx, ln) })
	}
	if adminLn != nil {
		log.Info("admin API and UI listening (TLS)", "url", adminURL)
		goRun("admin api", func(ctx context.Context) error { return srv.Serve(ctx, adminLn) })
	}
	goRun("join", func(ctx context.Context) error { return joinSrv.Serve(ctx, joinLn) })
	for i, r := range netRuns {
		goRun(fmt.Sprintf("netboot %d", i), r)
	}
	goRun("git source", src.Run)
	goRun("status writer", writer.Run)
	goRun("reconciler", ctrl.Run)
	if enr != nil {
		goRun("auto-enrol proposals", enr.Run)
	}
	if cfg.BMCWatchInterval >= 0 {
		w := newBMCWatch(st, sweepDrivers, cfg.BMCWatchInterval, log.With("component", "bmc-sweep"))
		goRun("bmc sweep", func(ctx context.Context) error { w.run(ctx); return nil })
	}
	hw := newHostWatch(st, drivers, fencer, ctrl.Desired, hostWatchConfig{heartbeat: cfg.Heartbeat, lost: cfg.HostLostWindow,
		fenceAfter: cfg.HostFenceWindow, share: cfg.Reconciler.Plan.BrakeShare}, log.With("component", "host-watch"))
	goRun("host watch", func(ctx context.Context) error { hw.run(ctx); return nil })
	goRun("prune", func(ctx context.Context) error { prune(ctx, st, 10*time.Minute, log); return nil })
	goRun("refusal summary", func(ctx context.Context) error { refusals.run(ctx, time.Minute); return nil })
	goRun("revisions", func(ctx context.Context) error {
		follow(ctx, src, ctrl, importer, imgStore, importFails, cfg.Mirrors, log)
		return nil
	})
	if cfg.OnReady != nil {
		cfg.OnReady(run)
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		return err
	}
	log.Info("controller stopped")
	return nil
}

// follow hands every new good revision to the reconciler and imports its
// images; while the newest revision is invalid, nothing new is acted on
// (the last good revision stays desired, and no new deploy starts).
func follow(ctx context.Context, src *reconciler.Source, ctrl *reconciler.Controller, importer *images.Importer, store *images.Store,
	fails *importFailures, mirrors images.Mirrors, log *slog.Logger) {
	var lastDigest string
	stopImports := func() {}
	defer func() { stopImports() }()
	apply := func() {
		good, invalid := src.Latest()
		ctrl.SetHoldDeploys(invalid != nil)
		if good.Inventory == nil || good.Digest == lastDigest {
			return
		}
		lastDigest = good.Digest
		ctrl.SetDesired(good.Inventory)
		reqs := imageRequests(good.Inventory, mirrors)
		// A new revision starts a new import round; the previous one's
		// retries stop (its failures are re-recorded by this round).
		stopImports()
		ictx, cancel := context.WithCancel(ctx)
		stopImports = cancel
		go importWithRetry(ictx, importer.ImportAll, reqs, fails, importRetryMin, importRetryMax, func() {
			// Installer ISOs: extract the kernel and initrd (RHEL: the
			// tree) now, so the first deploy does not wait for it.
			for _, p := range good.Inventory.Profiles {
				if kind, ok := installerKind(string(p.Deploy)); ok {
					if _, err := store.InstallerTree(ictx, p.Image, kind); err != nil {
						log.Warn("installer image", "image", p.Image, "profile", p.Name, "err", err)
					}
				}
			}
			ctrl.Trigger()
		}, log)
	}
	apply()
	for {
		select {
		case <-ctx.Done():
			return
		case <-src.Changed():
			apply()
		}
	}
}

// imageRequests turns images.yaml entries into import requests.
func imageRequests(inv *inventory.Inventory, mirrors images.Mirrors) []images.Request {
	var out []images.Request
	installer := map[string]bool{}
	for _, p := range inv.Profiles {
		if _, ok := installerKind(string(p.Deploy)); ok {
			installer[p.Image] = true
		}
	}
	for _, im := range inv.Images {
		r := images.Request{Name: im.Name, Catalog: im.Catalog, Arch: im.Arch, URL: im.URL, Checksum: im.Checksum, ChecksumURL: im.ChecksumURL, Mirrors: mirrors,
			Installer: installer[im.Name]}
		if im.Mirror != "" {
			r.Mirrors.Base = im.Mirror
		}
		out = append(out, r)
	}
	return out
}

// prune removes expired tokens and old events every interval until ctx is done.
func prune(ctx context.Context, st *state.Store, every time.Duration, log *slog.Logger) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if _, err := st.Prune(); err != nil {
				log.Error("prune state", "err", err)
			}
		}
	}
}

// statusFeed passes reconcile passes' plans to the status writer, at most
// once per gap: each hand-over scans the store for stalled servers (to
// decide urgency), while a busy reconciler runs several passes a second.
// The snapshot itself is built by the writer when it writes. A pass that
// arrives inside the gap is kept and handed over when the gap ends, so the
// newest pass is always the one that reaches the status writer.
type statusFeed struct {
	mu      sync.Mutex
	build   func(reconciler.Result)
	gap     time.Duration // least time between builds; 0 builds every pass
	last    time.Time     // start of the newest build
	pending *reconciler.Result
	timer   *time.Timer
}

func (f *statusFeed) onPass(res reconciler.Result) {
	f.mu.Lock()
	b := f.build
	if b == nil {
		f.mu.Unlock()
		return
	}
	if wait := f.gap - time.Since(f.last); wait > 0 {
		f.pending = &res
		if f.timer == nil {
			f.timer = time.AfterFunc(wait, f.flush)
		}
		f.mu.Unlock()
		return
	}
	f.last = time.Now()
	f.mu.Unlock()
	b(res)
}

// flush builds the pass kept by onPass, if any.
func (f *statusFeed) flush() {
	f.mu.Lock()
	res, b := f.pending, f.build
	f.pending, f.timer = nil, nil
	f.last = time.Now()
	f.mu.Unlock()
	if res != nil && b != nil {
		b(*res)
	}
}

// imageStatus keeps the importer's latest status per image for status/.
type imageStatus struct {
	mu sync.Mutex
	m  map[string]images.Status
}

// RecordImageStatus implements images.StatusRecorder.
func (s *imageStatus) RecordImageStatus(_ context.Context, name string, st images.Status) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.m[name] = st
	return nil
}

func (s *imageStatus) list() []reconciler.ImageStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []reconciler.ImageStatus
	for name, st := range s.m {
		is := reconciler.ImageStatus{Name: name, State: string(st.State), SizeBytes: st.SizeBytes, Message: st.Reason}
		if st.Raw.Hex != "" {
			is.Checksum = string(st.Raw.Algo) + ":" + st.Raw.Hex
		}
		out = append(out, is)
	}
	return out
}

// statusUrgency decides which status updates skip the commit interval:
// those that bring news an operator waits for, a newly invalid inventory
// revision or a newly stalled server. A revision that stays invalid or a
// server that stays stalled is not news again at every pass (the status
// file already says so), so it does not make a commit per pass.
type statusUrgency struct {
	mu      sync.Mutex
	invalid string          // commit of the invalid revision last reported
	stalled map[string]bool // servers stalled at the last check
}

// check returns true when inv names another invalid revision than the
// last check or stalled names a server that was not stalled then.
func (u *statusUrgency) check(inv *reconciler.InvalidRevision, stalled []string) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	urgent := false
	if inv != nil && inv.Commit != u.invalid {
		urgent = true
	}
	u.invalid = ""
	if inv != nil {
		u.invalid = inv.Commit
	}
	now := make(map[string]bool, len(stalled))
	for _, n := range stalled {
		now[n] = true
		urgent = urgent || !u.stalled[n]
	}
	u.stalled = now
	return urgent
}

// statusBuildGap is the least time between status builds for a status
// commit interval: a fifth of it, at most 1 s (a zero interval means the
// 30 s default). A status commit then lags the newest pass by at most the
// gap, and an urgent condition (a stalled server) reaches Git at most one
// gap later than it would with a build per pass.
func statusBuildGap(interval time.Duration) time.Duration {
	if interval <= 0 {
		interval = 30 * time.Second
	}
	return min(interval/5, time.Second)
}
