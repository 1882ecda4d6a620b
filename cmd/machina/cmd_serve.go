package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"runtime"
	"runtime/metrics"
	"runtime/pprof"
	"strings"
	"sync"
	"time"

	"net/netip"

	"github.com/machina-metal/machina/api"
	"github.com/machina-metal/machina/boot"
	"github.com/machina-metal/machina/controller"
	"github.com/machina-metal/machina/internal/connlimit"
	"github.com/machina-metal/machina/join"
	"github.com/machina-metal/machina/reconciler"
	"github.com/machina-metal/machina/state"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// Environment variables read by machina serve and machina token.
const (
	envMasterKey = "MACHINA_API_KEY_MASTER_KEY" // secret: read from the environment only, never a flag
	envState     = "MACHINA_STATE"
	envListen    = "MACHINA_LISTEN"
	envLogFormat = "MACHINA_LOG_FORMAT"
	envLogLevel  = "MACHINA_LOG_LEVEL"
)

// defaultStatePath is the state file when neither --state nor
// MACHINA_STATE is given.
const defaultStatePath = "/var/lib/machina/state.db"

// ServeConfig is machina serve's configuration. Zero values are usable
// except StatePath. The lead wires further servers (DHCP, TFTP, boot, join,
// reconciler) into Run next to the admin API.
type ServeConfig struct {
	// StatePath is the bbolt state file, or an etcd site
	// (etcd://HOST:PORT[,HOST:PORT]/PREFIX, state.ParseEtcdTarget); required.
	StatePath string
	// EtcdTLS are the etcd client's TLS files (--etcd-ca, --etcd-cert,
	// --etcd-key) for an etcd StatePath; all empty: plain http unless the
	// URL's query names them.
	EtcdTLS state.EtcdTLSFiles
	// Listen is the admin API's TCP address; empty means 127.0.0.1:8080.
	Listen string
	// MasterKey seals secrets (MACHINA_API_KEY_MASTER_KEY); empty stores
	// them unsealed, with a warning at start-up.
	MasterKey []byte
	// LockTimeout bounds the wait for the state file's lock; zero means 1s.
	LockTimeout time.Duration
	// PruneInterval is how often expired tokens and old events are pruned;
	// zero means 10 minutes.
	PruneInterval time.Duration
	// Logger receives the controller's logs; nil discards.
	Logger *slog.Logger
	// Setup, if set, runs after the store is open and the admin API built,
	// before anything is served: the place to mount more handlers
	// (srv.HandleAdmin, srv.HandlePublic) and build components that need
	// the store. An error aborts start-up.
	Setup func(st *state.Store, srv *api.Server) error
	// AdminTLS is the admin API's TLS listener (see controller.AdminTLS):
	// off loopback the admin API answers only there.
	AdminTLS controller.AdminTLS
	// OnReady, if set, is called with the admin API's bound address once it
	// accepts connections (tests use it with Listen "127.0.0.1:0"): the
	// TLS listener's when one runs, else the plain one's.
	OnReady func(apiAddr net.Addr)
}

// Run opens the store and serves until ctx is done, then returns nil. It
// fails at once if another process holds the state file, if the master key
// is wrong, or if sealed secrets exist but no master key is set.
func (c ServeConfig) Run(ctx context.Context) error {
	if c.StatePath == "" {
		return errors.New("serve: no state file (--state or " + envState + ")")
	}
	if c.Listen == "" {
		c.Listen = "127.0.0.1:8080"
	}
	if c.PruneInterval <= 0 {
		c.PruneInterval = 10 * time.Minute
	}
	log := c.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	st, srv, err := c.openStore(log)
	if err != nil {
		return err
	}
	defer st.Close()
	var ca *join.CA
	if c.AdminTLS.Listen != "" || !controller.IsLoopback(c.Listen) {
		if ca, err = join.LoadOrCreateCA(st, nil); err != nil {
			return fmt.Errorf("serve: CA: %w", err)
		}
	}
	// Each listener gets its share of RLIMIT_NOFILE, as under the
	// controller (docs/operations.md, "Connection budgets").
	conns, err := controller.NewConnBudget()
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	b := conns.Budget()
	adminLn, adminURL, err := controller.ListenAdminTLSLimited(c.Listen, c.AdminTLS, ca, connlimit.Config{Name: "admin",
		MaxPerIP: api.DefaultMaxConnsPerIP, MaxTotal: b.Admin, Refused: srv.ConnsRefused(), Logger: log.With("component", "api")})
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	conns.Add("admin", adminLn)
	raw, err := net.Listen("tcp", c.Listen)
	if err != nil {
		if adminLn != nil {
			adminLn.Close()
		}
		return fmt.Errorf("serve: listen %s: %w", c.Listen, err)
	}
	name, total := "machine", b.Machine
	if adminLn == nil {
		name, total = "api", b.Machine+b.Admin
	}
	ln := conns.Wrap(raw, connlimit.Config{Name: name, MaxPerIP: api.DefaultMaxConnsPerIP, MaxTotal: total, Refused: srv.ConnsRefused(),
		Logger: log.With("component", "api")})
	if err := srv.Registry().Register(conns); err != nil {
		ln.Close()
		if adminLn != nil {
			adminLn.Close()
		}
		return fmt.Errorf("serve: %w", err)
	}
	return c.serve(ctx, st, srv, ln, adminLn, adminURL, log)
}

// serve runs the pruner and the admin API on ln (and the TLS adminLn, if
// any) until ctx is done or a listener fails.
func (c ServeConfig) serve(ctx context.Context, st *state.Store, srv *api.Server, ln, adminLn net.Listener, adminURL string, log *slog.Logger) error {
	var err error
	ready := ln.Addr()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		prune(ctx, st, c.PruneInterval, log)
	}()
	errc := make(chan error, 2)
	if adminLn != nil {
		ready = adminLn.Addr()
		srv.SetAdminURL(adminURL)
		log.Info("admin API listening (TLS)", "url", adminURL, "state", c.StatePath)
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := srv.Serve(ctx, adminLn); err != nil {
				errc <- err
				cancel()
			}
		}()
	}
	log.Info("admin API listening", "addr", ln.Addr().String(), "state", c.StatePath, "machine_only", adminLn != nil && !controller.IsLoopback(ln.Addr().String()))
	if c.OnReady != nil {
		c.OnReady(ready)
	}
	if adminLn != nil && !controller.IsLoopback(ln.Addr().String()) {
		err = srv.ServeMachine(ctx, ln)
	} else {
		err = srv.Serve(ctx, ln)
	}
	cancel()
	wg.Wait()
	close(errc)
	if err == nil {
		err = <-errc
	}
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	log.Info("stopped")
	return nil
}

// openStore opens the state store, checks its secrets against the master
// key, builds the admin API and runs Setup. The caller closes the store.
func (c ServeConfig) openStore(log *slog.Logger) (_ *state.Store, _ *api.Server, err error) {
	st, err := state.OpenTarget(c.StatePath, c.EtcdTLS, state.Options{Timeout: c.LockTimeout, MasterKey: c.MasterKey, Logger: log.With("component", "state")})
	if err != nil {
		return nil, nil, fmt.Errorf("serve: %w", explainOpen(c.StatePath, err))
	}
	defer func() {
		if err != nil {
			st.Close()
		}
	}()
	sec, err := st.SecretsStatus()
	if err != nil {
		return nil, nil, fmt.Errorf("serve: %w", err)
	}
	switch {
	case !sec.Sealing && sec.Sealed > 0:
		return nil, nil, fmt.Errorf("serve: the state file holds %d sealed secrets but %s is not set", sec.Sealed, envMasterKey)
	case !sec.Sealing:
		log.Warn("secrets are stored unsealed: set "+envMasterKey+" to encrypt them at rest", "unsealed", sec.Unsealed)
	default:
		log.Info("secrets are sealed with AES-256-GCM", "sealed", sec.Sealed)
	}
	srv, err := api.New(api.Config{Store: st, Logger: log.With("component", "api")})
	if err != nil {
		return nil, nil, fmt.Errorf("serve: %w", err)
	}
	if c.Setup != nil {
		if err := c.Setup(st, srv); err != nil {
			return nil, nil, fmt.Errorf("serve: setup: %w", err)
		}
	}
	return st, srv, nil
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
			res, err := st.Prune()
			if err != nil {
				log.Error("prune state", "err", err)
				continue
			}
			if res.Events+res.Tokens > 0 {
				log.Debug("pruned state", "events", res.Events, "tokens", res.Tokens)
			}
		}
	}
}

// addEtcdTLSFlags adds --etcd-ca, --etcd-cert and --etcd-key (and, with h,
// the HA flags of a group on etcd, addHAFlags): file paths
// (a key's contents never travel in argv).
func addEtcdTLSFlags(f *pflag.FlagSet, files *state.EtcdTLSFiles, h *haFlags) {
	if h != nil {
		addHAFlags(f, h)
	}
	f.StringVar(&files.CAFile, "etcd-ca", "", "PEM CA file of the etcd members' certificates (an etcd --state; turns on TLS)")
	f.StringVar(&files.CertFile, "etcd-cert", "", "PEM client certificate file for etcd's --client-cert-auth (with --etcd-key)")
	f.StringVar(&files.KeyFile, "etcd-key", "", "PEM private key file of --etcd-cert")
}

// explainOpen adds the operator's next step to state.Open errors.
func explainOpen(path string, err error) error {
	switch {
	case errors.Is(err, state.ErrLocked):
		return fmt.Errorf("state file %s is in use by another process (another machina serve, or a machina command still running): %w", path, err)
	case errors.Is(err, state.ErrWrongMasterKey):
		return fmt.Errorf("%s does not open this state file's secrets; use the key they were sealed with: %w", envMasterKey, err)
	case errors.Is(err, state.ErrNoStateFile):
		return fmt.Errorf("no state file at %s (wrong --state or %s? machina serve creates it on its first start): %w", path, envState, err)
	}
	return err
}

// startCPUProfile starts the runtime's CPU profiler writing to path
// (created with mode 0600, truncated) and returns the function that stops it
// and closes the file. It is a diagnostics aid for bench/scale; the profile
// holds stack samples only, no request data.
func startCPUProfile(path string) (stop func(), err error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	return func() { pprof.StopCPUProfile(); _ = f.Close() }, nil
}

// watchHeapPeak samples the runtime's live heap and goroutine stack bytes
// (runtime/metrics /gc/heap/live:bytes and /memory/classes/heap/stacks:bytes)
// every second until stop is closed, and writes the heap profile to path
// each time their sum exceeds the largest seen by more than 4 MiB, so path
// ends up holding the heap at its peak, which is what a memory target is
// about. It logs the peak on return.
func watchHeapPeak(path string, log *slog.Logger, stop <-chan struct{}) {
	samples := []metrics.Sample{{Name: "/gc/heap/live:bytes"}, {Name: "/memory/classes/heap/stacks:bytes"}, {Name: "/sched/goroutines:goroutines"}}
	var peak, peakGoroutines uint64
	defer func() {
		log.Info("heap peak", "liveAndStacksMiB", peak>>20, "goroutinesAtPeak", peakGoroutines, "profile", path)
	}()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		metrics.Read(samples)
		cur := samples[0].Value.Uint64() + samples[1].Value.Uint64()
		if cur > peak+4<<20 {
			peak, peakGoroutines = cur, samples[2].Value.Uint64()
			writeHeapProfile(path, log, false)
		}
	}
}

// writeHeapProfile writes the runtime's heap profile to path (mode 0600),
// after a garbage collection when gc is set (on exit), logging instead of
// failing.
func writeHeapProfile(path string, log *slog.Logger, gc bool) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		log.Error("heap profile", "err", err)
		return
	}
	defer f.Close()
	if gc {
		runtime.GC()
	}
	if err := pprof.WriteHeapProfile(f); err != nil {
		log.Error("heap profile", "err", err)
	}
}

// newLogger builds the process logger: format json (default) or text,
// level debug, info (default), warn or error.
func newLogger(w io.Writer, format, level string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("log level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch strings.ToLower(format) {
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("log format %q: want json or text", format)
}

// readMasterKeyFile reads a master key file: its content up to the first
// newline, at least state.MinMasterKeyLen bytes. A file readable by group
// or others is refused.
func readMasterKeyFile(path string) ([]byte, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("master key file: %w", err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("master key file %s has mode %04o: want 0600 (chmod 600 %s)", path, fi.Mode().Perm(), path)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("master key file: %w", err)
	}
	key, _, _ := strings.Cut(string(data), "\n")
	key = strings.TrimSuffix(key, "\r")
	if len(key) < state.MinMasterKeyLen {
		return nil, fmt.Errorf("master key file %s: key is %d bytes, want at least %d (machina bootstrap writes 64 hex digits)", path, len(key), state.MinMasterKeyLen)
	}
	return []byte(key), nil
}

func envOrDefault(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// nodeBinaryFlags registers the machina-node executables the join
// listener serves: --node-binary (amd64) and --node-binary-arm64 (arm64
// hosts, /join/machina-node?arch=arm64).
func nodeBinaryFlags(f *pflag.FlagSet, cc *controller.Config) {
	f.StringVar(&cc.NodeBinary, "node-binary", os.Getenv("MACHINA_NODE_BINARY"), "machina-node executable served to installing hosts")
	f.StringVar(&cc.NodeBinaryARM64, "node-binary-arm64", os.Getenv("MACHINA_NODE_BINARY_ARM64"), "arm64 machina-node executable served to installing arm64 hosts (GOARCH=arm64 go build ./cmd/machina-node)")
}

// newServeCmd is `machina serve`.
func newServeCmd(e *env) *cobra.Command {
	var c ServeConfig
	var cc controller.Config
	var haf haFlags
	var o serveOpts
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the controller: reconciler, admin API, boot and machine endpoints, images, Git source and status",
		Long: "Run the controller until interrupted. With --repo it runs everything: Git source, reconciler,\n" +
			"status writer, iPXE boot and machine-facing endpoints, image store. Without --repo only the\n" +
			"state store and admin API run (to store BMC credentials before the first reconcile).\n" +
			"The master key for sealing secrets is read from " + envMasterKey + " only; it is never a flag.\n" +
			"An HTTPS Git token is read from the file or environment variable named by --repo-token-file or\n" +
			"--repo-token-env, never from a flag value.\n" +
			"Every flag is also read from MACHINA_<FLAG> (--join-listen: MACHINA_JOIN_LISTEN) and from the --config\n" +
			"file (keys are the flag names; machina bootstrap writes /etc/machina/machina.yaml); precedence: flag,\n" +
			"environment, file, default. Off loopback the admin API and UI answer only over TLS (--admin-listen).",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runServe(cmd, e, &c, &cc, &haf, &o) },
	}
	f := cmd.Flags()
	addServeFlags(f, &c, &cc, &haf, &o)
	addServeGitFlags(f, &cc)
	addServeNetFlags(f, &cc)
	addServeReconcilerFlags(f, &cc)
	return cmd
}

// serveOpts are machina serve's flags that configure the process, not
// the controller.
type serveOpts struct {
	logFormat, logLevel, cpuProfile, memProfile, configPath, masterKeyFile string
	printConfig                                                            bool
}

// runServe is machina serve's body: it reads the flag sources, starts the
// diagnostics and runs the admin API alone (no --repo) or the controller.
func runServe(cmd *cobra.Command, e *env, c *ServeConfig, cc *controller.Config, haf *haFlags, o *serveOpts) error {
	if err := applySources(cmd.Flags(), o.configPath, os.Getenv, "config", "print-config"); err != nil {
		return usageError{err}
	}
	if o.printConfig {
		_, err := io.WriteString(e.stdout, effectiveConfig(cmd.Flags(), "config", "print-config"))
		return err
	}
	log, err := newLogger(e.stderr, o.logFormat, o.logLevel)
	if err != nil {
		return err
	}
	c.Logger = log
	c.MasterKey = []byte(os.Getenv(envMasterKey))
	if len(c.MasterKey) == 0 && o.masterKeyFile != "" {
		if c.MasterKey, err = readMasterKeyFile(o.masterKeyFile); err != nil {
			return fmt.Errorf("serve: %w", err)
		}
	}
	if o.cpuProfile != "" {
		stop, err := startCPUProfile(o.cpuProfile)
		if err != nil {
			return err
		}
		defer stop()
	}
	if o.memProfile != "" {
		defer writeHeapProfile(o.memProfile+".exit", log, true)
		stop := make(chan struct{})
		defer close(stop)
		go watchHeapPeak(o.memProfile, log, stop)
	}
	if err := checkServeFlags(cc, *haf, c.StatePath, cmd.Flags().Changed); err != nil {
		return err
	}
	if cc.Repo.URL == "" {
		return c.Run(cmd.Context())
	}
	cc.StatePath, cc.Listen, cc.MasterKey, cc.Logger, cc.AdminTLS = c.StatePath, c.Listen, c.MasterKey, log, c.AdminTLS
	cc.EtcdTLS = c.EtcdTLS
	cc.AutoEnroll = boot.AutoEnrollFromEnv(os.Getenv)
	return controller.Run(cmd.Context(), *cc)
}

// addServeFlags adds the process's, the state's and the admin API's flags.
func addServeFlags(f *pflag.FlagSet, c *ServeConfig, cc *controller.Config, haf *haFlags, o *serveOpts) {
	f.StringVar(&o.configPath, "config", os.Getenv("MACHINA_CONFIG"), "YAML file whose keys are these flags' names (e.g. /etc/machina/machina.yaml from machina bootstrap); precedence: flag, env MACHINA_<FLAG>, file, default; an unknown key is an error")
	f.BoolVar(&o.printConfig, "print-config", false, "print the configuration these flags, MACHINA_<FLAG> and --config give, as a --config file, and exit (it holds no secret: none is a flag)")
	f.StringVar(&o.masterKeyFile, "master-key-file", "", "file holding the master key that seals secrets (machina bootstrap writes /etc/machina/master.key: 64 hex digits, mode 0600); "+envMasterKey+" wins when set")
	f.StringVar(&c.AdminTLS.Listen, "admin-listen", "", "TLS address of the admin API and UI; empty: none when --listen is loopback, else --listen's host on port "+controller.DefaultAdminTLSPort)
	f.StringVar(&c.AdminTLS.CertFile, "tls-cert", "", "PEM certificate (chain) of the admin TLS listener; empty: issued by the controller's CA")
	f.StringVar(&c.AdminTLS.KeyFile, "tls-key", "", "PEM private key of --tls-cert")
	f.StringSliceVar(&c.AdminTLS.Names, "admin-name", nil, "extra DNS name or IP address in the CA-issued admin certificate (repeatable)")
	f.StringVar(&c.StatePath, "state", envOrDefault(envState, defaultStatePath), "bbolt state file, or an etcd site etcd://HOST:PORT[,HOST:PORT...]/PREFIX (the path is the key prefix; env "+envState+")")
	addEtcdTLSFlags(f, &c.EtcdTLS, haf)
	f.StringVar(&c.Listen, "listen", envOrDefault(envListen, "127.0.0.1:8080"), "admin API address (env "+envListen+")")
	f.StringVar(&o.memProfile, "mem-profile", "", "diagnostics: write a Go heap profile (pprof format, in-use and allocated) to this file whenever the live heap plus goroutine stacks reach a new peak (checked every second), and to FILE.exit on exit")
	f.StringVar(&o.cpuProfile, "cpu-profile", "", "diagnostics: write a Go CPU profile (pprof format) of the whole run to this file, closed on exit")
	f.StringVar(&o.logFormat, "log-format", envOrDefault(envLogFormat, "json"), "log format: json or text (env "+envLogFormat+")")
	f.StringVar(&o.logLevel, "log-level", envOrDefault(envLogLevel, "info"), "log level: debug, info, warn, error (env "+envLogLevel+")")
}

// addServeGitFlags adds the inventory repository's, the machine-facing
// URLs' and auto-enrolment's flags.
func addServeGitFlags(f *pflag.FlagSet, cc *controller.Config) {
	f.StringVar(&cc.Repo.URL, "repo", os.Getenv("MACHINA_REPO"), "inventory repository URL: file://, https:// or ssh:// (env MACHINA_REPO)")
	f.StringVar(&cc.Repo.Branch, "branch", envOrDefault("MACHINA_BRANCH", "main"), "inventory branch (env MACHINA_BRANCH)")
	f.StringVar(&cc.Repo.TokenFile, "repo-token-file", os.Getenv("MACHINA_REPO_TOKEN_FILE"), "file holding the HTTPS Git token")
	f.StringVar(&cc.Repo.TokenEnv, "repo-token-env", "", "environment variable holding the HTTPS Git token")
	f.StringVar(&cc.Repo.Username, "repo-username", "", "HTTPS Git user sent with the token (basic auth); empty: x-access-token (GitHub's convention; Gitea, Forgejo and GitLab accept any user with a token)")
	f.StringVar(&cc.Repo.CAFile, "repo-ca-file", "", "PEM bundle of CAs trusted for the HTTPS Git server, in addition to the system roots, for this remote only (BMCs and mirrors keep their own trust)")
	f.StringVar(&cc.Repo.SSHKeyFile, "ssh-key", os.Getenv("MACHINA_SSH_KEY"), "SSH private key file for ssh:// repositories")
	f.StringVar(&cc.Repo.KnownHostsFile, "known-hosts", os.Getenv("MACHINA_KNOWN_HOSTS"), "known_hosts file (required for ssh://)")
	f.StringVar(&cc.StatusBranch, "status-branch", os.Getenv("MACHINA_STATUS_BRANCH"), "write status commits to this branch instead of the inventory branch")
	f.StringVar(&cc.WorkDir, "work-dir", envOrDefault("MACHINA_WORK_DIR", "/var/lib/machina"), "folder for Git clones and the image store")
	f.StringVar(&cc.PublicURL, "public-url", os.Getenv("MACHINA_PUBLIC_URL"), "the controller's URL as machines reach it (iPXE scripts, deploy plans)")
	f.StringVar(&cc.FirmwareURL, "firmware-url", os.Getenv("MACHINA_FIRMWARE_URL"), "the controller's URL as BMCs reach it, for the firmware update files it offers them (default: --public-url)")
	f.StringVar(&cc.RamdiskDir, "ramdisk-dir", os.Getenv("MACHINA_RAMDISK_DIR"), "folder with vmlinuz and initrd.cpio.gz (make ramdisk), served at /boot/ramdisk/")
	f.StringVar(&cc.ISODir, "iso-dir", os.Getenv("MACHINA_ISO_DIR"), "folder with the iPXE ISOs (make ipxe-iso), served at /boot/iso/")
	f.DurationVar(&cc.LLDPWait, "lldp-wait", 0, "bound on the commissioning ramdisk's LLDP listen on every NIC (machina.lldp_wait=; 0: the agent's 32 s, negative: off, at most 10m)")
	f.Int64Var(&cc.ImageEgressBytesPerSecond, "image-egress-rate", 0, "cap on the bytes per second of all image downloads from the controller together (a token bucket; deploy waves fetch the rest from each other); 0 is unlimited")
	f.StringVar(&cc.Mirrors.Base, "mirror", os.Getenv("MACHINA_MIRROR"), "base URL of a local mirror for catalog images")
	f.DurationVar(&cc.PollInterval, "poll-interval", 30*time.Second, "how often the inventory branch tip is polled")
	f.StringVar(&cc.WebhookSecretFile, "webhook-secret-file", "", "file holding the secret of the Git host's push webhook; set, POST /api/v1/git/webhook (operator listener, no admin token) takes GitHub, Gitea/Forgejo and GitLab push deliveries signed with it and polls at once")
	f.StringArrayVar(&cc.EventsOut.URLs, "webhook-out", nil, "POST every controller event to this http(s) URL as a CloudEvents 1.0 JSON event signed with --webhook-out-secret-file's key (repeatable; docs/operations.md \"Events out (webhooks)\")")
	f.StringVar(&cc.EventsOut.SecretFile, "webhook-out-secret-file", "", "file holding the HMAC-SHA256 key that signs --webhook-out requests (X-Machina-Signature); required with --webhook-out")
	f.StringSliceVar(&cc.EventsOut.Kinds, "webhook-out-kinds", nil, "send only events whose kind starts with one of these prefixes (comma-separated, e.g. lifecycle,server.); empty: every event")
	f.StringVar(&cc.JoinListen, "join-listen", envOrDefault("MACHINA_JOIN_LISTEN", "127.0.0.1:8443"), "TLS join listener address")
	f.StringVar(&cc.JoinURL, "join-url", os.Getenv("MACHINA_JOIN_URL"), "the join listener's URL as hosts reach it")
	nodeBinaryFlags(f, cc)
	f.StringVar(&cc.AttestEKCAFile, "attest-ek-ca-file", os.Getenv("MACHINA_ATTEST_EK_CA_FILE"), "PEM file of the TPM vendors' EK CA certificates; set, an attesting TPM must present an EK certificate chaining to one (docs/attestation.md)")
	f.StringSliceVar(&cc.AttestBootApplications, "attest-boot-apps", nil, "hex SHA-256 Authenticode digests of the EFI applications served (iPXE, ramdisk kernel); set, an attesting machine whose event log names another is refused")
	f.StringSliceVar(&cc.AttestInitrds, "attest-initrds", nil, "hex SHA-256 digests of the initrds served, as Linux's EFI stub measures them into PCR 9; set, another is refused")
	f.StringVar(&cc.AutoEnrollZone, "auto-enroll-zone", envOrDefault("MACHINA_AUTO_ENROLL_ZONE", "discovered"), "zone of auto-enrolled servers (env MACHINA_AUTO_ENROLL_ZONE; auto-enrol itself is "+boot.AutoEnrollEnv+"=1)")
	f.IntVar(&cc.AutoEnrollMax, "auto-enroll-max", 16, "auto-enrolled servers pending review at most; further unknown MACs are refused")
	f.StringVar(&cc.AutoEnrollCommitTo, "auto-enroll-commit-to", os.Getenv("MACHINA_AUTO_ENROLL_COMMIT_TO"), "commit auto-enrol proposals straight onto this branch (the inventory branch); empty pushes review branches discovered/DATE")
}

// addServeNetFlags adds the DHCP, TFTP and per-client limit flags.
func addServeNetFlags(f *pflag.FlagSet, cc *controller.Config) {
	f.StringSliceVar(&cc.Netboot.Interfaces, "dhcp-interface", nil, "serve DHCP (and the IPv6 RA) on this provisioning interface (repeatable)")
	f.StringVar((*string)(&cc.Netboot.Mode), "dhcp-mode", "full", "DHCP mode: full (addresses from --dhcp-pool) or proxy (PXE options only)")
	f.Func("dhcp-subnet", "provisioning subnet, e.g. 10.99.0.0/24", func(v string) (err error) { cc.Netboot.Subnet, err = netip.ParsePrefix(v); return })
	f.Func("dhcp-pool", "dynamic pool FIRST-LAST, e.g. 10.99.0.100-10.99.0.199", func(v string) error {
		a, b, ok := strings.Cut(v, "-")
		if !ok {
			return errors.New("want FIRST-LAST")
		}
		var err error
		if cc.Netboot.PoolStart, err = netip.ParseAddr(a); err != nil {
			return err
		}
		cc.Netboot.PoolEnd, err = netip.ParseAddr(b)
		return err
	})
	f.StringVar(&cc.Netboot.TFTPRoot, "tftp-root", os.Getenv("MACHINA_TFTP_ROOT"), "serve TFTP from this folder (iPXE binaries, e.g. /usr/lib/ipxe)")
	f.StringVar(&cc.Netboot.GRUBARM64, "grub-arm64", os.Getenv("MACHINA_GRUB_ARM64"), "arm64 GRUB network image (scripts/build-grub-arm64.sh: out/boot/grubnetaa64.efi), served by TFTP to DHCP arch 11 clients")
	f.StringVar(&cc.Netboot.ShimX64, "secureboot-shim", os.Getenv("MACHINA_SECUREBOOT_SHIM"), "signed shim for Secure Boot servers (profile firmware.secureBoot; Debian shim-signed: "+boot.DefaultShimPath+"), served by TFTP as shimx64.efi; needs --secureboot-grub")
	f.StringVar(&cc.Netboot.GRUBX64, "secureboot-grub", os.Getenv("MACHINA_SECUREBOOT_GRUB"), "signed GRUB network image shim loads (Debian grub-efi-amd64-signed: "+boot.DefaultGRUBX64Path+"), served by TFTP as grubx64.efi")
	f.IntVar(&cc.MachinePerIP.Burst, "machine-burst", 0, "boot and machine-facing requests per client IP at once (0: 20)")
	f.IntVar(&cc.MaxConnsPerIP, "max-conns-per-ip", 0, "open HTTP connections per client IP at most; further ones are closed at accept (0: 256)")
	f.DurationVar(&cc.MachinePerIP.Every, "machine-refill", 0, "one more request per client IP after this long (0: 100ms)")
	f.BoolVar(&cc.Netboot.RouterAdvert, "router-advert", true, "send an IPv6 RA (router lifetime 0) on the DHCP interfaces; iPXE then skips a 13 s IPv6 wait")
}

// addServeReconcilerFlags adds the reconciler's, the status writer's and
// the fleet watches' flags.
func addServeReconcilerFlags(f *pflag.FlagSet, cc *controller.Config) {
	f.IntVar(&cc.Reconciler.Workers, "workers", 8, "actions running at once")
	f.IntVar(&cc.Reconciler.PerRack, "per-rack", 4, "actions at once in one rack")
	f.DurationVar(&cc.Reconciler.ShutdownGrace, "shutdown-grace", reconciler.DefaultShutdownGrace, "on SIGTERM, actions still running (a BMC call, a power wait) get this long to finish; then they are interrupted, recorded as nothing but an INFO line, and resumed on the next start (negative: at once)")
	f.DurationVar(&cc.Reconciler.Interval, "reconcile-interval", 5*time.Second, "planning pass interval without a trigger")
	f.Float64Var(&cc.Reconciler.Plan.BrakeShare, "brake-share", 0.2, "safety brake: a revision that would release or retire more than this share of the fleet (servers not retired), above 0 and at most 1, is held until machinactl approve REV; one that brings a profile to zero is held at any share")
	f.DurationVar(&cc.Reconciler.Plan.DeployTimeout, "deploy-timeout", time.Hour, "a deploy (image or installer) that has not reported after this long fails and its server is powered off")
	f.DurationVar(&cc.Reconciler.Plan.SilentAfter, "machine-silent-after", 5*time.Minute, "a commissioning or image-deploying machine heard nothing from for this long is network-booted again with fresh tokens")
	f.DurationVar(&cc.MachineProgressEvery, "machine-progress-every", 20*time.Second, "a deploying ramdisk reports the image's download, write and read-back progress this often (at most a third of --machine-silent-after); a report whose bytes moved counts as hearing from the machine")
	f.IntVar(&cc.Reconciler.Plan.MaxRenetboots, "max-renetboots", 3, "network boots again per phase at most (then the deploy or commissioning deadline decides)")
	f.DurationVar(&cc.StatusInterval, "status-interval", 30*time.Second, "least time between status commits")
	f.DurationVar(&cc.BMCWatchInterval, "bmc-watch-interval", controller.DefaultBMCWatchInterval, "one sweep reading every BMC's power state and health spans this long (negative: off)")
	f.Uint8Var(&cc.IPMIMinCipherSuite, "ipmi-min-cipher-suite", 3, "weakest RMCP+ cipher suite an IPMI BMC's session may run with, judged by the algorithms it answers with: 3 (HMAC-SHA1, AES) or 17 (HMAC-SHA256, AES); servers.yaml bmc.minCipherSuite overrides it per server")
	f.DurationVar(&cc.Heartbeat, "heartbeat", 30*time.Second, "interval joined hosts heartbeat at")
	f.DurationVar(&cc.HostLostWindow, "host-lost-window", 0, "silence after which a host is marked HostLost and its power read from the BMC (0: 3 heartbeat intervals)")
	f.DurationVar(&cc.HostFenceWindow, "host-fence-window", 0, "further time a lost host of a profile with fence: auto stays lost before it is fenced, within the safety brake's share (0: the lost window again)")
}
