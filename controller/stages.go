package controller

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"github.com/machina-metal/machina/eventsout"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/machina-metal/machina/api"
	"github.com/machina-metal/machina/attestation"
	"github.com/machina-metal/machina/boot"
	"github.com/machina-metal/machina/boot/dhcp"
	"github.com/machina-metal/machina/boot/ipxe"
	"github.com/machina-metal/machina/fence"
	"github.com/machina-metal/machina/gitops"
	"github.com/machina-metal/machina/images"
	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/join"
	"github.com/machina-metal/machina/namerule"
	"github.com/machina-metal/machina/reconciler"
	"github.com/machina-metal/machina/reconciler/deployplan"
	"github.com/machina-metal/machina/reconciler/fleet"
	"github.com/machina-metal/machina/reconciler/plan"
	"github.com/machina-metal/machina/state"
)

// stage is one named step of Run's start-up. start builds its part of the
// wiring and returns its own stop function (nil: nothing to stop), which
// Run calls when it returns, newest first, whether a later stage failed or
// the controller ran and stopped.
type stage struct {
	name  string
	start func() (stop func(), err error)
}

// wiring is what the stages build, handed from one stage to the next.
type wiring struct {
	cfg Config
	log *slog.Logger

	st        *state.Store
	evOut     *eventsout.Sender // nil without Config.EventsOut.URLs
	ln        net.Listener
	publicURL string
	reg       *prometheus.Registry
	srv       *api.Server

	imgStore    *images.Store
	imgStatus   *imageStatus
	importFails *importFailures
	importer    *images.Importer
	fwOffers    *firmwareOffers

	drivers, sweepDrivers reconciler.Drivers
	feed                  *statusFeed
	ctrl                  *reconciler.Controller

	idx         *api.BootIndex
	refusals    *refusalSummary
	enr         *gitops.Enroller
	tpmPins     *gitops.TPMPinner
	leases      *api.StateLeases // full DHCP mode: kept in the state file (api/leases.go)
	netRuns     []func(context.Context) error
	bootHandler *ipxe.Handler

	conns    *ConnBudget // the listeners' shares of RLIMIT_NOFILE
	adminLn  net.Listener
	adminURL string
	joinLn   net.Listener
	joinURL  string
	joinSrv  *join.Server
	src      *gitops.Source
	writer   *gitops.StatusWriter
	builder  *gitops.StatusBuilder
	fencer   *fencer
	gitDir   string
	run      *Running
	ha       *haWiring // nil unless cfg.HA
}

// newWiring checks cfg and fills its defaults (the first lines of Run
// before the stages).
func newWiring(cfg Config) (*wiring, error) {
	if (cfg.StatePath == "" && cfg.HA == nil) || cfg.WorkDir == "" || cfg.Repo.URL == "" {
		return nil, errors.New("controller: StatePath (or HA), WorkDir and Repo.URL are required")
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
	if cfg.JoinListen == "" {
		cfg.JoinListen = "127.0.0.1:0"
	}
	if cfg.JoinTokenTTL <= 0 {
		cfg.JoinTokenTTL = 24 * time.Hour
	}
	if err := os.MkdirAll(cfg.WorkDir, 0o750); err != nil {
		return nil, fmt.Errorf("controller: %w", err)
	}
	if err := checkGroup(cfg); err != nil {
		return nil, err
	}
	return &wiring{cfg: cfg, log: log, gitDir: filepath.Join(cfg.WorkDir, "git")}, nil
}

// checkGroup checks Config.Group and Config.Zones (machina serve checks
// them first, with the flags' names).
func checkGroup(cfg Config) error {
	if cfg.Group == "" {
		if len(cfg.Zones) > 0 {
			return errors.New("controller: Zones need a Group")
		}
		return nil
	}
	if cfg.HA == nil {
		return errors.New("controller: a Group needs HA (the zone claims and the group's election live in etcd)")
	}
	if !namerule.Label.Valid(cfg.Group) {
		return fmt.Errorf("controller: group %q: want %s", cfg.Group, namerule.Label.What)
	}
	if len(cfg.Zones) == 0 {
		return fmt.Errorf("controller: group %s has no zones", cfg.Group)
	}
	for _, z := range cfg.Zones {
		if !namerule.Label.Valid(z) {
			return fmt.Errorf("controller: group %s: zone %q: want %s", cfg.Group, z, namerule.Label.What)
		}
	}
	return nil
}

// inScope reports whether server s is in the group's zones: its zone in
// servers.yaml, else its recorded zone (true without a group).
func (w *wiring) inScope(s *state.Server) bool {
	sc := w.scope()
	if sc == nil {
		return true
	}
	if inv := w.ctrl.Desired(); inv != nil {
		if ws := inv.Server(s.Name); ws != nil {
			return sc.Contains(ws.Zone)
		}
	}
	return sc.Contains(s.Zone)
}

// hostInScope is the host watch's filter: a group watches the hosts whose
// server is in its zones; nil (every host) without a group.
func (w *wiring) hostInScope() func(state.Host) bool {
	if w.scope() == nil {
		return nil
	}
	return func(h state.Host) bool {
		srv, err := w.st.Server(cmp.Or(h.Server, h.Name))
		return err == nil && w.inScope(&srv)
	}
}

// zoneClaims reads every group's zone claims for a planning pass and
// records this group's again when it is missing or differs (deleted by an
// operator while the group runs): a group never plans without its claim
// visible to the others. The write is fenced by the leader's term.
func (w *wiring) zoneClaims() (map[string][]string, error) {
	m, err := w.st.ZoneClaimMap()
	if err != nil {
		return nil, err
	}
	want := slices.Sorted(slices.Values(w.cfg.Zones))
	if slices.Equal(m[w.cfg.Group], slices.Compact(want)) {
		return m, nil
	}
	by := ""
	if w.cfg.HA != nil {
		by = w.cfg.HA.ID
	}
	if err := w.st.PutZoneClaim(w.cfg.Group, w.cfg.Zones, by); err != nil {
		return nil, fmt.Errorf("record the zone claim of group %s: %w", w.cfg.Group, err)
	}
	return w.st.ZoneClaimMap()
}

// scope is the group's plan scope, nil for the whole inventory.
func (w *wiring) scope() *plan.Scope {
	if w.cfg.Group == "" {
		return nil
	}
	return &plan.Scope{Group: w.cfg.Group, Zones: w.cfg.Zones}
}

// stages lists Run's start-up in order; each stage uses what the ones
// before it built.
func (w *wiring) stages() []stage {
	return []stage{
		{"state", w.openState},
		{"listen", w.listen},
		{"events out", w.eventsOut},
		{"images", w.images},
		{"bmc drivers", w.bmcDrivers},
		{"executor", w.executor},
		{"boot", w.boot},
		{"join", w.join},
		{"git", w.gitSide},
		{"routes", w.routes},
		{"ha", w.haStage},
	}
}

// openState opens the state store and refuses sealed secrets without a key.
func (w *wiring) openState() (func(), error) {
	opts := state.Options{MasterKey: w.cfg.MasterKey, Logger: w.log.With("component", "state")}
	var st *state.Store
	var stop func()
	if w.cfg.HA != nil {
		var err error
		if st, stop, err = w.openHAState(opts); err != nil {
			return nil, err
		}
	} else {
		var err error
		if st, err = state.OpenTarget(w.cfg.StatePath, w.cfg.EtcdTLS, opts); err != nil {
			return nil, fmt.Errorf("controller: open state: %w", err)
		}
		stop = func() { _ = st.Close() }
	}
	w.st = st
	if sec, err := st.SecretsStatus(); err == nil && !sec.Sealing {
		if sec.Sealed > 0 {
			return stop, fmt.Errorf("controller: the state file holds %d sealed secrets but no master key is set", sec.Sealed)
		}
		w.log.Warn("secrets are stored unsealed: set MACHINA_API_KEY_MASTER_KEY to encrypt them at rest")
	}
	return stop, nil
}

// listen opens the HTTP listener and builds the API server on it.
func (w *wiring) listen() (func(), error) {
	ln, err := net.Listen("tcp", w.cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("controller: listen %s: %w", w.cfg.Listen, err)
	}
	w.ln = ln
	stop := func() { _ = ln.Close() }
	w.publicURL = w.cfg.PublicURL
	if w.publicURL == "" {
		w.publicURL = "http://" + ln.Addr().String()
	}
	w.reg = prometheus.NewRegistry()
	w.srv, err = api.New(api.Config{Store: w.st, Logger: w.log.With("component", "api"), Registry: w.reg, MaxConnsPerIP: w.cfg.MaxConnsPerIP,
		Git: w.gitHealth})
	if err != nil {
		return stop, fmt.Errorf("controller: %w", err)
	}
	if w.conns, err = NewConnBudget(); err != nil {
		return stop, err
	}
	if err := w.reg.Register(w.conns); err != nil {
		return stop, fmt.Errorf("controller: %w", err)
	}
	return stop, nil
}

// images opens the image store, builds the importer and serves /images/.
func (w *wiring) images() (func(), error) {
	imagesDir := w.cfg.ImagesDir
	if imagesDir == "" {
		imagesDir = filepath.Join(w.cfg.WorkDir, "images")
	}
	var err error
	if w.imgStore, err = images.OpenStore(imagesDir); err != nil {
		return nil, fmt.Errorf("controller: image store: %w", err)
	}
	w.imgStatus = &imageStatus{m: map[string]images.Status{}}
	w.importFails = &importFailures{}
	w.importer, err = images.New(images.Config{Store: w.imgStore, Status: w.imgStatus, AllowFileURLs: w.cfg.AllowFileURLs, Logger: w.log.With("component", "images")})
	if err != nil {
		return nil, fmt.Errorf("controller: %w", err)
	}
	h, err := images.NewHandler(images.HandlerConfig{Store: w.imgStore, Tokens: deployplan.NewImageTokens(w.st), EgressBytesPerSecond: w.cfg.ImageEgressBytesPerSecond, Logger: w.log.With("component", "images")})
	if err != nil {
		return nil, fmt.Errorf("controller: %w", err)
	}
	if err := w.srv.HandlePublic("/images/", h); err != nil {
		return nil, err
	}
	base := w.cfg.FirmwareURL
	if base == "" {
		base = w.publicURL
	}
	w.fwOffers = newFirmwareOffers(w.imgStore, base, w.log.With("component", "firmware"))
	w.fwOffers.fails = w.importFails
	return nil, w.srv.HandlePublic(FirmwarePath, w.fwOffers)
}

// bmcDrivers picks the BMC drivers: cfg.Drivers, or two caches over the
// store's secrets (the reconciler's, and the sweep's own small one so
// reading every BMC in turn does not evict the reconciler's sessions).
func (w *wiring) bmcDrivers() (func(), error) {
	w.drivers, w.sweepDrivers = w.cfg.Drivers, w.cfg.Drivers
	if w.drivers != nil {
		return nil, nil
	}
	switch w.cfg.IPMIMinCipherSuite {
	case 0, 3, 17:
	default:
		return nil, fmt.Errorf("ipmi minimum cipher suite %d: want 3 or 17 (suites without integrity or encryption, with MD5 or RC4, are never accepted)", w.cfg.IPMIMinCipherSuite)
	}
	sd := &fleet.StoreDrivers{Store: w.st, Logger: w.log.With("component", "bmc"), MinIPMICipherSuite: w.cfg.IPMIMinCipherSuite}
	sw := fleet.NewSweepDrivers(w.st, w.log.With("component", "bmc-sweep"))
	sw.MinIPMICipherSuite = w.cfg.IPMIMinCipherSuite
	w.drivers, w.sweepDrivers = sd, sw
	return func() {
		// Logging out of every BMC is a courtesy (sessions also expire
		// on the BMC): bounded so Ctrl-C stops promptly.
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		var wg sync.WaitGroup
		for _, d := range []*fleet.StoreDrivers{sd, sw} {
			wg.Go(func() { d.Close(ctx) })
		}
		wg.Wait()
	}, nil
}

// executor builds the reconciler's executor over the store and drivers.
func (w *wiring) executor() (func(), error) {
	w.feed = &statusFeed{gap: statusBuildGap(w.cfg.StatusInterval)}
	rcfg := w.cfg.Reconciler
	rcfg.Store, rcfg.Drivers, rcfg.Logger = w.st, w.drivers, w.log.With("component", "reconciler")
	rcfg.Metrics = reconciler.NewMetrics(w.reg)
	if sc := w.scope(); sc != nil {
		rcfg.Scope, rcfg.Claims = sc, w.zoneClaims
	}
	if w.cfg.ISODir != "" {
		// The names scripts/metal/build-ipxe-iso.sh writes; the reconciler
		// picks one by the server's bootMode (and Secure Boot).
		if rcfg.ISOURL == "" {
			rcfg.ISOURL = w.publicURL + "/boot/iso/machina-ipxe-bios.iso"
		}
		if rcfg.UEFIISOURL == "" {
			rcfg.UEFIISOURL = w.publicURL + "/boot/iso/machina-ipxe-uefi.iso"
		}
		if rcfg.SBISOURL == "" {
			// scripts/metal/build-sb-iso.sh: Secure Boot servers.
			rcfg.SBISOURL = w.publicURL + "/boot/iso/machina-sb-uefi.iso"
		}
	}
	rcfg.OnPass = w.feed.onPass
	if rcfg.BeforeNetboot == nil {
		rcfg.BeforeNetboot = w.prepareBootToken
	}
	if rcfg.FirmwareImages == nil && w.fwOffers != nil {
		rcfg.FirmwareImages = w.fwOffers
	}
	if rcfg.DeployReady == nil {
		rcfg.DeployReady = deployReady(w.imgStore, w.importFails)
	}
	var err error
	if w.ctrl, err = reconciler.New(rcfg); err != nil {
		return nil, fmt.Errorf("controller: %w", err)
	}
	return nil, nil
}

// prepareBootToken mints the boot script's token of a server the executor
// is about to netboot (ipxe.Handler.Prepare), so its script
// request reads instead of writing; the boot stage builds the handler
// before the executor runs. A failure is logged: the script request then
// mints the token itself.
func (w *wiring) prepareBootToken(ctx context.Context, server, bootMAC string) {
	h := w.bootHandler
	if h == nil {
		return
	}
	mac, err := net.ParseMAC(bootMAC)
	if err != nil {
		return
	}
	if _, err := h.Prepare(ctx, mac); err != nil {
		w.log.Warn("prepare boot token", "server", server, "err", err)
	}
}

// deployReady says whether a profile's image can be deployed now: an
// installer's extracted kernel and initrd, or a verified image (else why
// not: the import's failure, or the image's state).
func deployReady(store *images.Store, fails *importFailures) func(inventory.Profile) error {
	return func(p inventory.Profile) error {
		if kind, ok := deployplan.InstallerKind(string(p.Deploy)); ok {
			// The installer boots from its ISO's kernel and initrd,
			// extracted after the import (follow).
			if _, err := store.InstallerReady(p.Image, kind); err != nil {
				return fmt.Errorf("installer image %s: %w", p.Image, err)
			}
			return nil
		}
		rec, err := store.Lookup(p.Image)
		if err == nil && rec.State == images.StateVerified {
			return nil
		}
		if ierr := fails.reason(p.Image); ierr != nil {
			return fmt.Errorf("image %s: %w", p.Image, ierr)
		}
		if err != nil {
			return fmt.Errorf("image %s: %w", p.Image, err)
		}
		return fmt.Errorf("image %s is %s, not verified yet", p.Image, rec.State)
	}
}

// boot builds the boot index, auto-enrolment, the netboot servers (DHCP,
// TFTP, RA) and the iPXE handler with its routes.
func (w *wiring) boot() (func(), error) {
	var err error
	if w.idx, err = api.NewBootIndex(w.st); err != nil {
		return nil, fmt.Errorf("controller: %w", err)
	}
	if w.refusals, err = newRefusalSummary(w.st, w.reg); err != nil {
		return nil, fmt.Errorf("controller: %w", err)
	}
	// When the controller serves the signed chain (--secureboot-shim and
	// --secureboot-grub), Secure Boot servers (profile
	// firmware.secureBoot) are marked on the index's answers: DHCP offers
	// them only shim, the script handler no iPXE script. Without the chain
	// it has nothing signed to offer, and they are booted as any other
	// server (firmware with Secure Boot on refuses the unsigned iPXE, and
	// the server shows MachineSilent).
	var lookup boot.Lookup = w.idx
	if nb := w.cfg.Netboot; nb.ShimX64 != "" && nb.GRUBX64 != "" {
		lookup = secureBootLookup{inner: w.idx, desired: w.ctrl.Desired, st: w.st}
	}
	ipxeCfg := ipxe.Config{Lookup: lookup, Tokens: w.idx, ControllerURL: w.publicURL, ISODir: w.cfg.ISODir, RamdiskDir: w.cfg.RamdiskDir,
		LLDPWait: w.cfg.LLDPWait, Logger: w.log.With("component", "ipxe"), PerIP: w.cfg.MachinePerIP, OnEvent: w.refusals.event}
	if err := w.tpmPinner(); err != nil {
		return nil, err
	}
	var enrHook boot.Enroller
	if w.cfg.AutoEnroll {
		if err := w.autoEnrol(); err != nil {
			return nil, err
		}
		ipxeCfg.AutoEnroll, ipxeCfg.Enroller = true, w.enr
		enrHook = w.enr
	}
	// In full DHCP mode the controller knows each MAC's address: plans,
	// reports, done and joins are refused from any other. The leases are
	// kept in the state file, so the check holds across a restart.
	if len(w.cfg.Netboot.Interfaces) > 0 && w.cfg.Netboot.Mode != dhcp.ModeProxy {
		w.leases = &api.StateLeases{Store: w.st}
	}
	// The kernel and initrd each machine fetched (BootStalled).
	fetches := newBootFetches(w.st)
	ipxeCfg.OnScript, ipxeCfg.OnServed = fetches.script, fetches.httpServed
	if w.bootHandler, err = ipxe.New(ipxeCfg); err != nil {
		return nil, fmt.Errorf("controller: %w", err)
	}
	h := w.bootHandler
	stop := func() { _ = h.Close() }
	sb := secureBootTFTP{script: h.TFTPScript, ramdiskDir: w.cfg.RamdiskDir, fetches: fetches}
	if w.netRuns, err = startNetboot(w.cfg.Netboot, lookup, w.publicURL, w.cfg.AutoEnroll, enrHook, w.leases, sb, w.log); err != nil {
		stop()
		return nil, fmt.Errorf("controller: %w", err)
	}
	paths := []string{ipxe.ScriptPath, boot.GRUBScriptPath} // GRUB: arm64 machines (docs/arm64.md)
	if w.cfg.ISODir != "" {
		paths = append(paths, "/boot/iso/")
	}
	if w.cfg.RamdiskDir != "" {
		paths = append(paths, "/boot/ramdisk/")
	}
	for _, p := range paths {
		if err := w.srv.HandlePublic(p, w.bootHandler); err != nil {
			return stop, err
		}
	}
	return stop, nil
}

// tpmPinner builds the proposer of servers.yaml tpm.ek pins for servers
// whose TPM attested (review branches tpm/DATE).
func (w *wiring) tpmPinner() error {
	prop, err := gitops.NewProposer(gitops.ProposerConfig{Remote: w.cfg.Repo, StateDir: filepath.Join(w.gitDir, "tpm"), BranchPrefix: "tpm",
		Logger: w.log.With("component", "tpm-pins")})
	if err != nil {
		return fmt.Errorf("controller: %w", err)
	}
	w.tpmPins, err = gitops.NewTPMPinner(gitops.TPMPinConfig{Store: w.st, Desired: w.ctrl.Desired, Proposer: prop, Logger: w.log.With("component", "tpm-pins")})
	if err != nil {
		return fmt.Errorf("controller: %w", err)
	}
	return nil
}

// autoEnrol builds the enroller of unknown PXE-booting machines and its
// Git proposer (cfg.AutoEnroll).
func (w *wiring) autoEnrol() error {
	cfg := w.cfg
	prop, err := gitops.NewProposer(gitops.ProposerConfig{Remote: cfg.Repo, StateDir: w.gitDir, CommitTo: cfg.AutoEnrollCommitTo,
		Logger: w.log.With("component", "auto-enrol")})
	if err != nil {
		return fmt.Errorf("controller: %w", err)
	}
	ctrl := w.ctrl
	w.enr, err = gitops.NewEnroller(gitops.EnrollConfig{Store: w.st, Desired: ctrl.Desired, Zone: cfg.AutoEnrollZone, Max: cfg.AutoEnrollMax,
		Proposer: prop, OnEnrolled: func(string) { ctrl.Trigger() }, Logger: w.log.With("component", "auto-enrol")})
	if err != nil {
		return fmt.Errorf("controller: %w", err)
	}
	zone, maxPending := cfg.AutoEnrollZone, cfg.AutoEnrollMax
	if zone == "" {
		zone = gitops.DefaultEnrollZone
	}
	if maxPending <= 0 {
		maxPending = gitops.DefaultEnrollMax
	}
	w.log.Warn("auto-enrol is on: any machine that PXE-boots on the provisioning network is commissioned and proposed into Git",
		"zone", zone, "max_pending", maxPending)
	return nil
}

// join opens the admin TLS listener and the join listener (its own TLS
// port, certificate signed by the controller CA, made on first start with
// its key sealed in the store), and mounts the machine-facing API with
// the deploy planner.
func (w *wiring) join() (func(), error) {
	ca, err := join.LoadOrCreateCA(w.st, nil)
	if err != nil {
		return nil, fmt.Errorf("controller: join CA: %w", err)
	}
	var stops []func()
	stop := func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}
	if w.adminLn, w.adminURL, err = ListenAdminTLSLimited(w.cfg.Listen, w.cfg.AdminTLS, ca, w.adminLimits()); err != nil {
		return nil, fmt.Errorf("controller: %w", err)
	}
	if w.adminLn != nil {
		stops = append(stops, func() { _ = w.adminLn.Close() })
		w.srv.SetAdminURL(w.adminURL)
		w.conns.Add("admin", w.adminLn)
	}
	certs := certExpiry{"join_ca": ca.Cert}
	if w.adminLn != nil && w.cfg.AdminTLS.CertFile != "" {
		if certs["admin_tls"], err = firstCertificate(w.cfg.AdminTLS.CertFile); err != nil {
			return stop, fmt.Errorf("controller: admin TLS: %w", err)
		}
	}
	if err := w.reg.Register(certs); err != nil {
		return stop, fmt.Errorf("controller: %w", err)
	}
	if w.joinLn, err = net.Listen("tcp", w.cfg.JoinListen); err != nil {
		return stop, fmt.Errorf("controller: join listen %s: %w", w.cfg.JoinListen, err)
	}
	stops = append(stops, func() { _ = w.joinLn.Close() })
	w.limitListeners()
	joinLim := limited(w.joinLn)
	w.joinURL = w.cfg.JoinURL
	if w.joinURL == "" {
		w.joinURL = "https://" + w.joinLn.Addr().String()
	}
	var joinLeases func(server string) (netip.Addr, bool)
	var machineLeases api.LeaseLookup
	if w.leases != nil {
		machineLeases = w.leases
		joinLeases = w.leasedIP
	}
	w.joinSrv, err = join.New(join.Config{Store: w.st, CA: ca, URL: w.joinURL, NodeBinary: w.cfg.NodeBinary, NodeBinaryARM64: w.cfg.NodeBinaryARM64, Heartbeat: w.cfg.Heartbeat,
		LeasedIP: joinLeases, DeclaredIPs: w.declaredIPs, Logger: w.log.With("component", "join")})
	if err != nil {
		return stop, fmt.Errorf("controller: %w", err)
	}
	if err := join.RegisterAdmin(w.srv, w.joinSrv, api.Actor); err != nil {
		return stop, err
	}
	if err := w.reg.Register(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "machina_join_conns_refused_total",
		Help: "Join listener connections closed at accept: their source address had 64 open, or the listener was at its budget (machina_listener_conns_refused_total{listener=\"join\"} by reason)."},
		func() float64 { st := joinLim.Stats(); return float64(st.RefusedPerIP + st.RefusedBudget) })); err != nil {
		return stop, fmt.Errorf("controller: %w", err)
	}
	if err := registerJoinMetrics(w.reg, w.joinSrv); err != nil {
		return stop, fmt.Errorf("controller: %w", err)
	}
	return stop, w.mountMachine(machineLeases)
}

// mountMachine mounts the machine-facing endpoints (report, plan, done,
// wipe, progress, attestation) with the deploy planner behind them, the
// piece counters of deploy waves and the TPM attestation verifier; leases
// binds machine requests to their DHCP address (nil without Machina's
// DHCP).
func (w *wiring) mountMachine(machineLeases api.LeaseLookup) error {
	jc := joinCommander{srv: w.joinSrv, desired: w.ctrl.Desired, ttl: w.cfg.JoinTokenTTL}
	pl := &deployplan.Planner{Desired: w.ctrl.Desired, Images: w.imgStore, BaseURL: w.publicURL, Join: jc, Store: w.st, Waves: deployplan.NewWaves(), Logger: w.log.With("component", "planner"),
		Addresses: deployplan.Leases{}}
	pieces, err := api.NewPieceMetrics(w.reg)
	if err != nil {
		return fmt.Errorf("controller: %w", err)
	}
	verifier, chain, err := newVerifier(w.cfg)
	if err != nil {
		return fmt.Errorf("controller: %w", err)
	}
	// The Secure Boot servers' chain, computed from the served files;
	// without the ramdisk folder the controller does not know what it
	// serves, and those servers get the operator's chain like the others.
	var sbChain *attestation.BootChain
	if nb := w.cfg.Netboot; nb.ShimX64 != "" && nb.GRUBX64 != "" && w.cfg.RamdiskDir != "" {
		c, err := secureBootChain(nb.ShimX64, nb.GRUBX64, w.cfg.RamdiskDir, chain)
		if err != nil {
			return fmt.Errorf("controller: %w", err)
		}
		sbChain = &c
	}
	machine, err := api.NewMachine(api.MachineConfig{Store: w.st, Planner: pl, Wiper: pl, Installer: pl, Pieces: pieces,
		PerIP: w.cfg.MachinePerIP, Leases: machineLeases, ProgressEvery: progressEvery(w.cfg.MachineProgressEvery, w.cfg.Reconciler.Plan.SilentAfter),
		SilentAfter: w.cfg.Reconciler.Plan.SilentAfter, Attest: verifier, AttestPolicy: attestPolicy{desired: w.ctrl.Desired, st: w.st, chain: chain, secureBoot: sbChain},
		Logger: w.log.With("component", "machine")})
	if err != nil {
		return fmt.Errorf("controller: %w", err)
	}
	if err := w.reg.Register(machine.AttestCollector()); err != nil {
		return fmt.Errorf("controller: %w", err)
	}
	return machine.Mount(w.srv)
}

// progressEvery is the ramdisk's progress interval: every (zero: 20
// seconds), at most a third of silentAfter (zero: the plan's 5 minutes),
// so that two reports fall within any silent-after window.
func progressEvery(every, silentAfter time.Duration) time.Duration {
	if every <= 0 {
		every = 20 * time.Second
	}
	if silentAfter <= 0 {
		silentAfter = 5 * time.Minute
	}
	return min(every, silentAfter/3)
}

// declaredIPs are server's static addresses: the fixed addresses of its
// servers.yaml network and the IPAM pool addresses the store holds for it.
func (w *wiring) declaredIPs(server string) []netip.Addr {
	var out []netip.Addr
	if s, err := w.st.Server(server); err == nil {
		for _, l := range s.Addresses {
			if a := l.Addr(); a.IsValid() {
				out = append(out, a)
			}
		}
	}
	if w.ctrl == nil {
		return out
	}
	if inv := w.ctrl.Desired(); inv != nil {
		if s := inv.Server(server); s != nil && s.Network != nil {
			for _, as := range s.Network.Addresses {
				for _, txt := range as {
					if p, err := netip.ParsePrefix(txt); err == nil {
						out = append(out, p.Addr())
					} else if a, err := netip.ParseAddr(txt); err == nil {
						out = append(out, a)
					}
				}
			}
		}
	}
	return out
}

// leasedIP is the address the DHCP server leased to server's boot MAC.
func (w *wiring) leasedIP(server string) (netip.Addr, bool) {
	s, err := w.st.Server(server)
	if err != nil || s.BootMAC == "" {
		return netip.Addr{}, false
	}
	return w.leases.LeasedIP(s.BootMAC)
}

// gitSide builds the Git source, the status writer and the feed from
// reconcile passes to the writer.
func (w *wiring) gitSide() (func(), error) {
	cfg, st := w.cfg, w.st
	var err error
	w.src, err = gitops.NewSource(gitops.SourceConfig{Remote: cfg.Repo, StateDir: w.gitDir, Interval: cfg.PollInterval, Logger: w.log.With("component", "git"),
		OnEvent: func(e gitops.SourceEvent) {
			_, _ = st.AppendEvent(state.Event{Kind: state.EventKind("inventory." + string(e.Kind)), Message: e.Message})
		}})
	if err != nil {
		return nil, fmt.Errorf("controller: %w", err)
	}
	w.writer, err = gitops.NewStatusWriter(gitops.StatusConfig{Remote: cfg.Repo, StatusBranch: cfg.StatusBranch, StateDir: w.gitDir,
		Interval: cfg.StatusInterval, Group: cfg.Group, Logger: w.log.With("component", "status")})
	if err != nil {
		return nil, fmt.Errorf("controller: %w", err)
	}
	w.builder = &gitops.StatusBuilder{Store: st}
	if w.scope() != nil {
		w.builder.Include = w.inScope
	}
	var urg statusUrgency
	w.feed.build = func(res plan.Result) {
		// The reconciler's first pass runs before the source's first
		// poll ends; a status commit then would name no revision. The
		// poll's new revision triggers a pass (SetDesired) that writes.
		if inv := w.src.InventoryStatus(); !w.src.Polled() && inv.Good.Commit == "" && inv.Invalid == nil {
			return
		}
		// The snapshot is built by the writer when it writes (see
		// UpdateFrom): a 10,000-server snapshot is tens of MB, and a build
		// per pass would mostly be garbage.
		stalled, err := st.StalledServers()
		if err != nil {
			w.log.Error("status: stalled servers", "err", err)
		}
		urgent := urg.check(w.src.InventoryStatus().Invalid, stalled)
		w.writer.UpdateFrom(w.snapshot(res), urgent)
	}
	return nil, nil
}

// snapshot returns the status snapshot builder for a pass's plan.
func (w *wiring) snapshot(res plan.Result) func() (gitops.Snapshot, error) {
	return func() (gitops.Snapshot, error) {
		return w.builder.Build(w.src.InventoryStatus(), w.imgStatus.list(), res)
	}
}

// WebhookPattern is the push webhook's route (Config.WebhookSecretFile).
const WebhookPattern = "POST /api/v1/git/webhook"

// routes mounts the admin, host, image, console and UI routes and makes
// the Running handed to OnReady.
func (w *wiring) routes() (func(), error) {
	cfg, st, srv, ctrl := w.cfg, w.st, w.srv, w.ctrl
	w.fencer = &fencer{st: st, drivers: w.drivers, desired: ctrl.Desired, opts: fence.Options{Timeout: cfg.FenceTimeout}, log: w.log.With("component", "fence")}
	a := adminRoutes{ctrl: ctrl, src: w.src, scan: cfg.Scan, propose: scanProposers(cfg.Repo, w.gitDir, w.log.With("component", "scan")), branch: cfg.Repo.Branch,
		fencer: w.fencer, trigger: ctrl.Trigger, heartbeat: cfg.Heartbeat, imgStore: w.imgStore, imgStatus: w.imgStatus, importFails: w.importFails,
		drivers: w.drivers, gitDir: w.gitDir, gitHealth: w.gitHealth, log: w.log}
	if cfg.WebhookSecretFile != "" {
		wh, err := gitops.NewWebhook(gitops.WebhookConfig{SecretFile: cfg.WebhookSecretFile, Branch: cfg.Repo.Branch,
			Trigger: w.src.Trigger, Logger: w.log})
		if err != nil {
			return nil, fmt.Errorf("controller: %w", err)
		}
		a.webhook = wh
	}
	uiRoutes, err := a.mount(srv, st)
	if err != nil {
		return nil, fmt.Errorf("controller: admin routes: %w", err)
	}
	var routes []string
	for _, p := range srv.Routes() {
		if p == uiPrefix {
			routes = append(routes, uiRoutes...) // the UI's own routes instead of its prefix
			continue
		}
		routes = append(routes, p)
	}
	w.run = &Running{Addr: w.ln.Addr(), URL: w.publicURL, Store: st, Reconciler: ctrl, Source: w.src, Status: w.writer, Images: w.imgStore,
		JoinURL: w.joinURL, AdminURL: w.adminURL, Routes: routes, JoinRoutes: w.joinSrv.Routes(),
		AdminRoutes: srv.AdminRoutes(), flush: w.flushStatus}
	return nil, nil
}

// flushStatus hands the snapshot to the writer's own loop (urgent) and
// waits for its next successful write: calling Write here would race with
// the loop on the same clone.
func (w *wiring) flushStatus(ctx context.Context) error {
	plan := w.ctrl.LastPlan()
	since := time.Now()
	w.writer.UpdateFrom(w.snapshot(plan), true)
	for {
		h := w.writer.Health()
		if h.LastSuccess.After(since) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("status flush: %w (last error: %s)", ctx.Err(), h.LastError)
		case <-time.After(50 * time.Millisecond):
		}
	}
}
