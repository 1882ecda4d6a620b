// Package controller wires Machina's components into the running
// controller: the state store, the admin API and machine-facing endpoints,
// the iPXE boot endpoints and the ramdisk files, the image store and its
// importer, the Git source, the reconciler and the status writer. It is
// what `machina serve` runs and what the simulated lab and the end-to-end
// tests start in-process.
//
// controller holds no logic of its own beyond wiring and small adapters;
// the rules live in the packages it connects (the BMC driver cache and
// sweep in reconciler/fleet, deploy plans in reconciler/deployplan). Run
// is a list of named start-up stages (stages.go), each returning its own
// error and stop function, and serve runs the components they register.
package controller

import (
	"context"
	"log/slog"
	"net"
	"time"

	"github.com/machina-metal/machina/boot"
	"github.com/machina-metal/machina/discover"
	"github.com/machina-metal/machina/gitops"
	"github.com/machina-metal/machina/ha"
	"github.com/machina-metal/machina/images"
	"github.com/machina-metal/machina/reconciler"
	"github.com/machina-metal/machina/reconciler/fleet"
	"github.com/machina-metal/machina/state"
)

// DefaultBMCWatchInterval is Config.BMCWatchInterval's default: how long
// one sweep of every BMC spans (fleet.DefaultBMCWatchInterval).
const DefaultBMCWatchInterval = fleet.DefaultBMCWatchInterval

// Config configures the controller. Zero values are usable except
// StatePath, WorkDir and Repo.URL.
type Config struct {
	// StatePath is the bbolt state file, or an etcd site
	// (etcd://HOST:PORT[,HOST:PORT]/PREFIX, see state.OpenTarget). Required.
	StatePath string
	// EtcdTLS are the etcd client's TLS files for an etcd StatePath.
	EtcdTLS state.EtcdTLSFiles
	// HA, if set, runs this controller as one of a group on etcd: the
	// state in etcd (StatePath an etcd:// target, or HA.Etcd), only the
	// elected leader acts (docs/ha.md). Nil: a single controller, as
	// before.
	HA *HAConfig
	// Group, if set, is this controller's group for a sharded site
	// (machina serve --group, docs/ha.md "Sharding"): with Zones, it plans
	// only the servers and profiles of Zones (plan.Scope), records
	// its claim on them in the shared state when it leads, refuses servers
	// another group claims too, is elected under its own key
	// (PREFIX groups/GROUP/leader) and writes status under status/GROUP/.
	// Needs HA. "": the whole inventory, as before.
	Group string
	// Zones are Group's zones (--zones), RFC 1123 labels; required with
	// Group.
	Zones []string
	// MasterKey seals secrets (MACHINA_API_KEY_MASTER_KEY); nil stores them
	// unsealed, with a warning.
	MasterKey []byte
	// Listen is the HTTP address of the admin API, the boot endpoints and
	// the machine-facing endpoints; "" means 127.0.0.1:8080.
	Listen string
	// PublicURL is the controller's base URL as machines reach it (iPXE
	// scripts, deploy plans); "" means http://<Listen's bound address>.
	PublicURL string
	// FirmwareURL is the controller's base URL as BMCs reach it, for the
	// firmware files it offers them (SimpleUpdate ImageURI, under
	// /firmware/); "" means PublicURL. Set it when the BMCs' management
	// network reaches the controller at another address.
	FirmwareURL string
	// WorkDir holds the Git clones (WorkDir/git) and, unless ImagesDir is
	// set, the image store (WorkDir/images). Required.
	WorkDir string
	// ImagesDir overrides the image store's folder.
	ImagesDir string
	// ImageEgressBytesPerSecond caps the controller's image responses
	// together (images.HandlerConfig.EgressBytesPerSecond); zero is
	// unlimited.
	ImageEgressBytesPerSecond int64
	// Mirrors re-roots catalog images at local mirrors.
	Mirrors images.Mirrors
	// AllowFileURLs lets images.yaml name file:// URLs (tests, the
	// simulated lab); off in production.
	AllowFileURLs bool
	// RamdiskDir holds vmlinuz and initrd.cpio.gz (make ramdisk), served at
	// /boot/ramdisk/ by boot/ipxe (through an os.Root: symlinks out of it are
	// refused); "" serves nothing there.
	RamdiskDir string
	// AttestEKCAFile is a PEM file of the TPM vendors' EK CA certificates
	// the operator trusts (self-signed ones are roots, the others
	// intermediates); set, a TPM must present an EK certificate that
	// chains to one. "" checks no EK certificate: the EK is identified by
	// its fingerprint (servers.yaml tpm.ek) alone.
	AttestEKCAFile string
	// AttestBootApplications are the hex SHA-256 Authenticode digests of
	// the EFI applications the controller serves (iPXE, the ramdisk
	// kernel), as UEFI measures them into PCR 4; set, an attesting machine
	// whose event log names another boot application is refused. Empty
	// checks none (attestation.BootChain).
	AttestBootApplications []string
	// AttestInitrds are the hex SHA-256 digests of the initrds served, as
	// Linux's EFI stub measures the initrd into PCR 9; empty checks none.
	AttestInitrds []string
	// ISODir holds the iPXE ISOs (make ipxe-iso), served at /boot/iso/.
	ISODir string
	// LLDPWait bounds the commissioning ramdisk's LLDP listen on every NIC
	// (ipxe.Config.LLDPWait); zero: the agent's 32 s, negative: off.
	LLDPWait time.Duration
	// Repo is the inventory repository.
	Repo gitops.Remote
	// StatusBranch sends status commits to a separate branch.
	StatusBranch string
	// PollInterval is the Git poll interval; zero means 30 s.
	PollInterval time.Duration
	// WebhookSecretFile, if set, enables the push webhook at
	// WebhookPattern on the operator's listener (gitops.Webhook: GitHub,
	// Gitea/Forgejo and GitLab deliveries signed with this file's secret
	// trigger a poll); "" mounts none.
	WebhookSecretFile string
	// EventsOut are the outgoing webhooks that receive the event log as
	// signed CloudEvents (package eventsout); the zero value sends none.
	// Under HA only the leader sends, from the cursors in the shared state.
	EventsOut EventsOutConfig
	// StatusInterval is the least time between status commits; zero means 30 s.
	StatusInterval time.Duration
	// Reconciler tunes the executor (workers, limits, backoff, deadlines);
	// Store, Drivers, Logger and OnPass are filled here.
	Reconciler reconciler.Config
	// Drivers opens BMC drivers; nil uses the store's secrets (fleet.StoreDrivers).
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
	// NodeBinaryARM64 is the arm64 machina-node the install script fetches
	// on arm64 hosts (join.Config.NodeBinaryARM64); "" serves none.
	NodeBinaryARM64 string
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
	// MachineProgressEvery is how often a deploying ramdisk reports its
	// progress (api.MachineConfig.ProgressEvery); zero means 20 seconds,
	// and it is lowered to a third of Reconciler.Plan.SilentAfter, so
	// that a machine whose bytes move is never taken for silent.
	MachineProgressEvery time.Duration
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
	// gitops.DefaultEnrollZone ("discovered", which no profile selects
	// until a reviewer changes it).
	AutoEnrollZone string
	// AutoEnrollMax bounds the auto-enrolled servers pending review; zero
	// means gitops.DefaultEnrollMax (16).
	AutoEnrollMax int
	// AutoEnrollCommitTo commits proposals straight onto this branch (it
	// must be Repo's branch); "" pushes review branches discovered/DATE.
	AutoEnrollCommitTo string
	// BMCWatchInterval is how long one sweep of every BMC's power state
	// and health rollup spans (reads paced evenly over it, the first sweep
	// a tenth of it after start, at most a minute); zero means
	// DefaultBMCWatchInterval (10 min), negative turns the sweep off.
	BMCWatchInterval time.Duration
	// Scan runs POST /api/v1/scan's sweeps; nil means discover.Scan. A
	// test sets it to send a scan of a private range to BMC emulators on
	// loopback (discover.Config.Targets and AllowLoopback).
	Scan func(ctx context.Context, cfg discover.Config) (*discover.Report, error)
	// IPMIMinCipherSuite is the weakest RMCP+ cipher suite an IPMI BMC's
	// session may run with, judged by the algorithms the BMC answers with:
	// 3 or 17; zero means 3. servers.yaml bmc.minCipherSuite overrides it
	// per server. A BMC answering with less is refused (BMCReachable=False
	// naming the suite it offered and the minimum).
	IPMIMinCipherSuite uint8
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
	Source *gitops.Source
	// Status is the status writer.
	Status *gitops.StatusWriter
	// Images is the image store.
	Images *images.Store
	// JoinURL is the join listener's base URL.
	JoinURL string
	// Routes are the route patterns of the HTTP listener's mux (API,
	// admin, machine-facing, boot, images, console and every UI route),
	// JoinRoutes those of the join listener (TLS), for tests and docs.
	Routes, JoinRoutes []string
	// AdminRoutes are the routes of Routes that need an admin token
	// (api.Server.AdminRoutes), each checked against api.RouteRoles.
	AdminRoutes []string
	// AdminURL is the admin API's TLS base URL, "" when it has no TLS
	// listener (loopback: the admin API is on Addr).
	AdminURL string
	// Elector is the HA election (Leader, IsLeader), nil without HA.
	Elector *ha.Elector

	flush func(ctx context.Context) error
}

// FlushStatus builds the status of the fleet now and commits it at once,
// waiting for the push (the status writer otherwise batches commits).
func (r *Running) FlushStatus(ctx context.Context) error { return r.flush(ctx) }

// Run starts every component and serves until ctx is done, then stops them
// and returns nil. A component failing to start is returned at once.
//
// Start-up is a list of named stages (smee's staged main): each builds
// its part of the wiring, returns its own error and its own stop function,
// and the stops run newest first when Run returns. The components the
// stages register are then served together (serve); the first to fail
// stops the others, and its error is returned.
func Run(ctx context.Context, cfg Config) error {
	w, err := newWiring(cfg)
	if err != nil {
		return err
	}
	for _, s := range w.stages() {
		stop, err := s.start()
		if stop != nil {
			defer stop()
		}
		if err != nil {
			return err
		}
	}
	return w.serve(ctx)
}
