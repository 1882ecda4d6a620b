// Package vm is the VM lab: the whole Machina flow on qemu virtual machines
// that really boot. Run creates a network namespace with a bridge
// (10.99.0.1/24, fd99::1/64) and five taps, runs the real controller
// (`machina serve`, with DHCP, TFTP, the IPv6 RA, HTTP boot, the iPXE ISOs,
// the image store and the join listener) inside it, and starts five qemu
// VMs (TCG only, side by side) with empty disks, each with a BMC:
//
//   - vm-bios: SeaBIOS, bmcsim Redfish (Dell tree with Pxe removed from the
//     boot override targets) over lab/vm/vmpower, so the controller boots it
//     from the BIOS iPXE ISO through virtual media;
//   - vm-uefi: OVMF, bmcsim Redfish over vmpower, PXE;
//   - vm-uefi-media: OVMF, bmcsim Redfish (the same no-Pxe Dell tree), so
//     the controller boots it from the UEFI iPXE ISO through virtual media;
//   - vm-ipmi: SeaBIOS, OpenIPMI ipmi_sim driving the VM through
//     cmd/lab-chassis-control, PXE; network first: its boot order keeps the
//     NIC first whatever boot device is set (vmpower Config.NetworkFirst),
//     so after its deploy it reaches its disk only through the deployed
//     machine's iPXE script, which the lab checks on its serial console.
//   - vm-pyghmi: SeaBIOS, a pyghmi BMC (internal/pyghmibmc: the
//     pyghmi.ipmi.bmc.Bmc class VirtualBMC builds on) driving the VM
//     through the same cmd/lab-chassis-control, PXE. It keeps only the
//     boot device (persistent and EFI flags read back cleared) and, as
//     VirtualBMC over libvirt, applies a new one at the next power-on
//     only: the controller learns both quirks (status bmcQuirks) and
//     reaches the deployed disk by powering off and on.
//
// It commits the inventory to a bare Git repository the controller polls,
// and asserts each step from the admin API and the controller's status
// commits, timing it: commission → deploy (profile count 2, and vm-pyghmi
// pinned to the profile) → first boot and join → release and retire.
//
// With Config.ARM64 the lab runs one arm64 UEFI VM instead (arm64.go):
// GRUB network boot from the controller's DHCP and TFTP,
// commissioning, an amd64 image refused, an arm64 image deployed and
// booted to the join.
//
// Everything stays inside the namespace or on loopback. On failure the
// lab folder (serial logs, controller log, inventory repository) is kept
// and its path is in the error.
package vm

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/go-git/go-git/v5"
	gitconfig "github.com/go-git/go-git/v5/config"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/object"

	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/bmc/bmcsim"
	"github.com/machina-metal/machina/boot"
	"github.com/machina-metal/machina/gitops"
	"github.com/machina-metal/machina/internal/pyghmibmc/bmcproc"
	"github.com/machina-metal/machina/lab/vm/ipmichassis"
	"github.com/machina-metal/machina/lab/vm/netns"
	"github.com/machina-metal/machina/lab/vm/osimage"
	"github.com/machina-metal/machina/lab/vm/qmp"
	"github.com/machina-metal/machina/lab/vm/vmpower"
)

// Lab network facts: the bridge inside the namespace and the controller's
// fixed ports on it (the namespace is private, so fixed ports cannot clash).
const (
	BridgeAddr = "10.99.0.1"
	Subnet     = "10.99.0.0/24"
	Pool       = "10.99.0.100-10.99.0.199"
	APIPort    = 8080
	JoinPort   = 8443
	AdminPort  = 8444 // the admin API and UI over TLS (controller.DefaultAdminTLSPort)
	IPMIPort   = 623
	// PyghmiPort is the pyghmi BMC's UDP port on the bridge (IPMIPort is
	// ipmi_sim's).
	PyghmiPort = 624
	// PyghmiMachine is the VM behind the pyghmi BMC.
	PyghmiMachine = "vm-pyghmi"
	ProfileName   = "lab"
	ImageName     = "lab-os"
)

// Budget is the time a whole run (StageRelease) must stay under on a
// 2-core machine under TCG.
const Budget = 15 * time.Minute

// Stage selects how far Run goes.
type Stage int

// Stages, in order; each includes the ones before it.
const (
	// StageCommission: inventory committed, all five VMs commission to ready.
	StageCommission Stage = iota + 1
	// StageDeploy: profile count 2 and vm-pyghmi pinned: three VMs deploy,
	// boot their disk and join; vm-pyghmi's BMC quirks are in its status.
	StageDeploy
	// StageRelease: one deployed VM released (want: ready), the other retired.
	StageRelease
)

// ErrPrereq is returned when a binary or file the lab needs is missing.
var ErrPrereq = errors.New("vm lab: missing prerequisite")

// Config configures Run.
type Config struct {
	// Root is the repository root: bin/{machina,machinactl,machina-node,
	// lab-chassis-control} and out/ramdisk/{vmlinuz,initrd.cpio.gz} must
	// exist (make build ramdisk). Required.
	Root string
	// Dir is the lab folder; zero makes one under os.TempDir(). It is removed
	// after a passing run unless Keep is set.
	Dir  string
	Keep bool
	// ImageCache is osimage.Ensure's cache directory; zero means its default.
	ImageCache string
	// Stage is how far to go; zero means StageRelease (everything).
	Stage Stage
	// Logger receives progress lines; nil discards.
	Logger *slog.Logger
	// OnStep is called after each asserted step with its name and duration.
	OnStep func(name string, d time.Duration)
	// TimeScale multiplies every step's deadline, for a machine shared
	// with other work (TCG slows down with the load); zero means 1.
	TimeScale float64
	// ARM64 runs the arm64 lab (RunARM64) instead of the five
	// amd64 VMs: one arm64 UEFI VM (qemu-system-aarch64 virt, TCG, AAVMF)
	// behind a bmcsim Redfish BMC, network-booted through GRUB's arm64
	// image from the controller's DHCP and TFTP. Stage is ignored.
	ARM64 bool
	// Trust runs the Secure Boot lab (runTrust, lab/vm/trust.go) instead:
	// one x86-64 VM with OVMF Secure Boot, Microsoft's keys and a swtpm
	// TPM 2.0, booted through Debian's signed shim and GRUB, attested
	// against the chain the controller computes. Stage is ignored.
	Trust bool
	// Host runs the production-grade host lab (runHost, host.go)
	// instead of the five amd64 VMs: one UEFI VM with a swtpm TPM, two
	// NICs bonded under a VLAN and a bridge, two virtio disks in a RAID1
	// root and an NVMe volume group. Stage is ignored.
	Host bool
}

// Step is one asserted step of a run and how long it took.
type Step struct {
	Name     string
	Duration time.Duration
}

// machine is one lab VM and its BMC.
type machine struct {
	name   string
	zone   string
	mac    string
	fw     vmpower.Firmware
	driver string // "redfish" or "ipmi"
	tree   string
	// vmedia: the BMC's tree offers no Pxe boot override, so the controller
	// boots the iPXE ISO of the server's boot mode (isoName) from virtual
	// media instead.
	vmedia bool
	// networkFirst: the machine's boot order puts its NIC first and its
	// BMC never changes it (vmpower Config.NetworkFirst; a Redfish BMC also
	// gets bmcsim Quirks.NetworkFirst: overrides are stored but ignored),
	// as libvirt-backed BMCs and servers with PXE first in their boot order
	// behave. After its deploy it network-boots every time and reaches its
	// disk only through the deployed machine's iPXE script
	// (boot.ChainScript: sanboot of drive 0x80, or iPXE ends and the
	// firmware boots its next device).
	networkFirst bool
	// pyghmi: driver "ipmi" served by a pyghmi BMC (internal/pyghmibmc)
	// that applies the boot device at power-on, not by ipmi_sim.
	pyghmi bool
	bmc    *bmcsim.Server
	pyBMC  *bmcproc.BMC
	// trust: Secure Boot OVMF with Microsoft's keys and a swtpm TPM
	// (Config.Trust); tpm is its TPM.
	trust bool
	tpm   *swtpm
	vm    *vmpower.VM
	addr  string // BMC address as the controller reaches it
	// extraMACs are NICs after the boot NIC, each on a tap of its own
	// (after every machine's first tap).
	extraMACs []string
	// diskBytes is the size of the first disk (disk.raw); zero means 4 GiB.
	diskBytes int64
	// tune, when set, adjusts the VM's configuration before it is
	// created (more disks, a TPM) and may start what the VM needs.
	tune func(cfg *vmpower.Config) error
	// preStart, when set, runs before every qemu start of the VM
	// (vmpower SetPreStart).
	preStart func(ctx context.Context) error
}

type lab struct {
	cfg   Config
	log   *slog.Logger
	dir   string
	ns    *netns.Namespace
	token string
	api   *v1.Client
	hc    *http.Client
	// adminBase is the admin API's TLS URL (https://BridgeAddr:AdminPort).
	adminBase string
	bare      string
	clone     string
	ms        []*machine
	servers   []*http.Server
	serve     *netns.Process
	// serveArgs are the controller's arguments at setup (without
	// "serve" and the log format), for a restart with some changed.
	serveArgs []string
	steps     []Step
	start     time.Time
	bmcPass   string
	ipmPass   string
	wg        sync.WaitGroup
	// stopWatch ends the reset watchers (watchResets).
	stopWatch context.CancelFunc
	// sshKeyPath and sshPub: the lab's key, in the profile's sshKeys, for
	// the join-token check on deployed hosts (tokencheck.go).
	sshKeyPath, sshPub string
	// armMirror serves the arm64 OS image (Config.ARM64; "" otherwise).
	armMirror string
	// host holds the host lab's own processes and files (Config.Host;
	// nil otherwise).
	host *hostLab
	// spoof is the Secure Boot lab's spoofing VM (trust.go; nil until it
	// starts).
	spoof *spoofer
}

// Run runs the VM lab up to cfg.Stage (or the arm64 lab, cfg.ARM64) and
// returns the timed steps. It needs root, qemu-system-x86_64, ipmi_sim,
// ovmf and the built binaries; the arm64 lab needs qemu-system-aarch64,
// AAVMF and make lab-arm64's builds instead of the first three.
func Run(ctx context.Context, cfg Config) (steps []Step, err error) {
	if cfg.Stage == 0 {
		cfg.Stage = StageRelease
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	// Paths under Root go to ipmi_sim's configuration and the controller's
	// flags, which want absolute ones (make lab passes -root .).
	root, err := filepath.Abs(cfg.Root)
	if err != nil {
		return nil, fmt.Errorf("vm lab: root: %w", err)
	}
	cfg.Root = root
	l := &lab{cfg: cfg, log: cfg.Logger, start: time.Now()}
	l.ms = l.machines()
	if err := l.prereqs(); err != nil {
		return nil, err
	}
	l.dir = cfg.Dir
	if l.dir == "" {
		if l.dir, err = os.MkdirTemp("", "machina-vm-lab-"); err != nil {
			return nil, fmt.Errorf("vm lab: %w", err)
		}
	} else if err := os.MkdirAll(l.dir, 0o755); err != nil {
		return nil, fmt.Errorf("vm lab: %w", err)
	}
	defer func() {
		l.close()
		if err != nil {
			err = fmt.Errorf("%w (serial logs, controller log and inventory repository kept in %s)", err, l.dir)
		} else if !cfg.Keep && cfg.Dir == "" {
			_ = os.RemoveAll(l.dir)
		}
	}()
	switch {
	case cfg.ARM64:
		err = l.runARM64(ctx)
	case cfg.Trust:
		err = l.runTrust(ctx)
	case cfg.Host:
		err = l.runHost(ctx)
	default:
		err = l.run(ctx)
	}
	return l.steps, err
}

// scale applies Config.TimeScale to a step deadline.
func (l *lab) scale(d time.Duration) time.Duration {
	if l.cfg.TimeScale > 1 {
		return time.Duration(float64(d) * l.cfg.TimeScale)
	}
	return d
}

func (l *lab) bin(name string) string { return filepath.Join(l.cfg.Root, "bin", name) }

func (l *lab) prereqs() error {
	cmds := []string{"qemu-system-x86_64", "ipmi_sim", "ip", "ssh", "ssh-keygen"}
	files := []string{l.bin("machina"), l.bin("machinactl"), l.bin("machina-node"), l.bin("lab-chassis-control"),
		filepath.Join(l.cfg.Root, "out", "ramdisk", "vmlinuz"), filepath.Join(l.cfg.Root, "out", "ramdisk", "initrd.cpio.gz"),
		"/usr/lib/ipxe/undionly.kpxe", "/usr/lib/ipxe/snponly.efi", bmcproc.Python, bmcproc.Module}
	hint := "run make build ramdisk; apt-get install ipxe ovmf python3-pyghmi"
	if l.cfg.Trust {
		cmds = append(cmds, "swtpm", "swtpm_setup")
		files = append(files, ovmfSecureCode, ovmfSecureVars, boot.DefaultShimPath, boot.DefaultGRUBX64Path)
		hint += " swtpm swtpm-tools shim-signed grub-efi-amd64-signed"
	}
	if l.cfg.ARM64 {
		files = []string{l.bin("machina"), l.bin("machinactl"), l.bin("machina-node"),
			filepath.Join(l.cfg.Root, "out", "ramdisk", "arm64", "vmlinuz"), filepath.Join(l.cfg.Root, "out", "ramdisk", "arm64", "initrd.cpio.gz"),
			l.grubImage(), l.bin("arm64/machina-node"), filepath.Join(l.armImageDir(), osimage.SumsFile), "/usr/share/AAVMF/AAVMF_CODE.fd", "/usr/share/AAVMF/AAVMF_VARS.fd", "/usr/lib/ipxe/undionly.kpxe", "/usr/lib/ipxe/snponly.efi"}
		hint = "run make lab-arm64 (build, bin/arm64/machina-node, ramdisk ARCH=arm64, scripts/build-grub-arm64.sh, os-image-arm64); apt-get install qemu-system-arm qemu-efi-aarch64 ipxe"
	}
	for _, b := range cmds {
		if _, err := exec.LookPath(b); err != nil {
			return fmt.Errorf("%w: %s not in PATH", ErrPrereq, b)
		}
	}
	for _, f := range files {
		if _, err := os.Stat(f); err != nil {
			return fmt.Errorf("%w: %s (%s)", ErrPrereq, f, hint)
		}
	}
	if os.Geteuid() != 0 {
		return fmt.Errorf("%w: root (network namespaces, taps)", ErrPrereq)
	}
	return nil
}

func (l *lab) step(name string, t0 time.Time) {
	d := time.Since(t0)
	l.steps = append(l.steps, Step{Name: name, Duration: d})
	l.log.Info("step done", "step", name, "took", d.Round(100*time.Millisecond), "total", time.Since(l.start).Round(time.Second))
	if l.cfg.OnStep != nil {
		l.cfg.OnStep(name, d)
	}
}

func (l *lab) run(ctx context.Context) error {
	t0 := time.Now()
	img, sum, err := osimage.Ensure(ctx, l.cfg.ImageCache)
	if err != nil {
		return fmt.Errorf("vm lab: os image: %w", err)
	}
	l.step("os image (cached: "+filepath.Base(filepath.Dir(img))+")", t0)

	t0 = time.Now()
	if err := l.setup(ctx, img, sum); err != nil {
		return err
	}
	l.step("setup: netns, BMCs, repository, controller", t0)

	// Commissioning: every VM PXE-boots the ramdisk, reports and powers off.
	t0 = time.Now()
	if err := l.waitServers(ctx, "all commission to ready", l.scale(8*time.Minute), func(ss []v1.Server) error {
		want := map[string]string{}
		for _, m := range l.ms {
			want[m.name] = "ready"
		}
		return l.lifecycles(ss, want, true)
	}); err != nil {
		return err
	}
	for _, m := range l.ms {
		if err := l.waitStatus(ctx, gitops.ServerStatusPath(m.name), "lifecycle: ready"); err != nil {
			return err
		}
	}
	for _, m := range l.ms {
		if m.vmedia {
			if err := l.insertedMedia(m); err != nil {
				return err
			}
		}
	}
	l.step(fmt.Sprintf("commission: %d servers ready (BIOS and UEFI Redfish via virtual media with their ISOs, UEFI Redfish PXE, BIOS ipmi_sim PXE, BIOS pyghmi PXE), status commits written", len(l.ms)), t0)
	if l.cfg.Stage < StageDeploy {
		return nil
	}

	t0 = time.Now()
	if err := l.push(ctx, "profile lab: count 2; "+PyghmiMachine+" pinned to it", func() error {
		if err := replaceFile(filepath.Join(l.clone, "profiles.yaml"), "count: 0", "count: 2"); err != nil {
			return err
		}
		return replaceFile(filepath.Join(l.clone, "servers.yaml"), "  - name: "+PyghmiMachine+"\n", "  - name: "+PyghmiMachine+"\n    want: deployed\n    profile: "+ProfileName+"\n")
	}); err != nil {
		return err
	}
	// deployed: the two the count allocated; vm-pyghmi deploys by its pin.
	var deployed []string
	if err := l.waitServers(ctx, "two deployed by count, "+PyghmiMachine+" by its pin", l.scale(10*time.Minute), func(ss []v1.Server) error {
		deployed = deployed[:0]
		py := "not listed"
		for _, s := range ss {
			if s.Name == PyghmiMachine {
				py = s.Lifecycle
			} else if s.Lifecycle == "deployed" {
				deployed = append(deployed, s.Name)
			}
			if s.Lifecycle == "failed" {
				return fmt.Errorf("%s failed: %s", s.Name, s.LastError)
			}
		}
		if len(deployed) != 2 || py != "deployed" {
			return fmt.Errorf("%d deployed by count, %s %s", len(deployed), PyghmiMachine, py)
		}
		return nil
	}); err != nil {
		return err
	}
	wave, err := l.waveShared(ctx, append(slices.Clone(deployed), PyghmiMachine), img, sum)
	if err != nil {
		return err
	}
	l.step("deploy: 2 servers deployed by count ("+strings.Join(deployed, ", ")+") and "+PyghmiMachine+" by its pin"+wave, t0)

	t0 = time.Now()
	// The join-token check runs while the hosts boot and join: it logs in
	// as soon as sshd answers and samples the process list until joined.
	type checked struct {
		name, result string
		err          error
	}
	checks := make(chan checked, len(deployed))
	for _, m := range l.ms {
		if m.name != deployed[0] && m.name != deployed[1] {
			continue
		}
		go func() {
			r, err := l.checkToken(ctx, m, l.scale(8*time.Minute))
			checks <- checked{m.name, r, err}
		}()
	}
	if err := l.waitHosts(ctx, append(slices.Clone(deployed), PyghmiMachine), l.scale(8*time.Minute)); err != nil {
		return err
	}
	for range deployed {
		c := <-checks
		if c.err != nil {
			return c.err
		}
		l.log.Info("join token check", "vm", c.name, "result", c.result)
	}
	nf, err := l.networkFirstBooted(deployed)
	if err != nil {
		return err
	}
	l.step("first boot: cloud-init seed applied, hosts joined over pinned TLS with bridge network; join token never in argv, cloud-init logs or journal, token file removed"+nf, t0)

	t0 = time.Now()
	if err := l.pyghmiQuirks(ctx); err != nil {
		return err
	}
	l.step(PyghmiMachine+": its pyghmi BMC's quirks learned (status bmcQuirks "+bmcQuirkBootFlags+", "+bmcQuirkAtPowerOn+"); the disk reached by a power-off and power-on, not a reset", t0)

	t0 = time.Now()
	if err := l.hostLostAndBack(ctx, deployed[0]); err != nil {
		return err
	}
	l.step("liveness: "+deployed[0]+" frozen (QMP stop: its node agent stops heartbeating) → HostLost, lost powered on; QMP cont → heartbeats again, cleared", t0)
	if l.cfg.Stage < StageRelease {
		return nil
	}

	t0 = time.Now()
	release, retire := deployed[0], deployed[1]
	if err := l.push(ctx, "release "+release+", retire "+retire, func() error {
		if err := replaceFile(filepath.Join(l.clone, "profiles.yaml"), "count: 2", "count: 0"); err != nil {
			return err
		}
		if err := replaceFile(filepath.Join(l.clone, "servers.yaml"), "  - name: "+retire+"\n", "  - name: "+retire+"\n    want: retired\n"); err != nil {
			return err
		}
		return nil
	}); err != nil {
		return err
	}
	// Two of five servers is more than the 20% a revision may release or
	// retire: the brake holds the plan until an operator approves it.
	if err := l.approveHeld(ctx); err != nil {
		return err
	}
	if err := l.waitServers(ctx, "release and retire", l.scale(8*time.Minute), func(ss []v1.Server) error {
		return l.lifecycles(ss, map[string]string{release: "ready", retire: "retired"}, false)
	}); err != nil {
		return err
	}
	// The released server is netbooted into the ramdisk's wipe mode,
	// which clears its partition tables and signatures and powers off.
	if err := l.waitServers(ctx, "release wipe", l.scale(8*time.Minute), func(ss []v1.Server) error {
		for _, s := range ss {
			if s.Name == release && s.NeedsWipe {
				return fmt.Errorf("%s: release wipe not done yet (power %s)", release, s.Power.State)
			}
		}
		return nil
	}); err != nil {
		return err
	}
	// Both are then powered off by their BMCs (release: after the wipe;
	// retire: off for good).
	for _, m := range l.ms {
		if m.name != release && m.name != retire {
			continue
		}
		wctx, cancel := context.WithTimeout(ctx, l.scale(2*time.Minute))
		err := m.vm.WaitOff(wctx)
		cancel()
		if err != nil {
			return fmt.Errorf("vm lab: %s still powered on after release/retire: %w", m.name, err)
		}
	}
	l.step("release "+release+" → ready and wiped by the ramdisk, retire "+retire+" → retired, both powered off, after approving the braked plan", t0)
	return nil
}

// lifecycles checks that each named server has the wanted lifecycle; with
// hw, ready servers must carry hardware facts.
func (l *lab) lifecycles(ss []v1.Server, want map[string]string, hw bool) error {
	var bad []string
	seen := map[string]bool{}
	for _, s := range ss {
		w, ok := want[s.Name]
		if !ok {
			continue
		}
		seen[s.Name] = true
		if s.Lifecycle == "failed" {
			return fmt.Errorf("%s failed: %s", s.Name, s.LastError)
		}
		if s.Lifecycle != w || (hw && w == "ready" && s.Hardware == nil) {
			bad = append(bad, fmt.Sprintf("%s=%s(%s)", s.Name, s.Lifecycle, s.LastError))
		}
	}
	// A server the API does not list yet (the controller has not read
	// the first inventory revision) is not there yet either.
	for _, name := range slices.Sorted(maps.Keys(want)) {
		if !seen[name] {
			bad = append(bad, name+" not listed yet")
		}
	}
	if len(bad) > 0 {
		return errors.New(strings.Join(bad, " "))
	}
	return nil
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// nsPrefix starts the lab's network namespace name (netns.Create adds a
// random suffix): one per kind of lab, so that labs running side by side
// (.ci/run's lab_host_arm64) are told apart in `ip netns` and in their
// logs. Nothing else the labs make is shared: each has its own namespace
// (bridge, taps, addresses and ports inside it), temporary folder and
// processes.
func (l *lab) nsPrefix() string {
	switch {
	case l.cfg.ARM64:
		return "m14-arm64"
	case l.cfg.Trust:
		return "m14-trust"
	case l.cfg.Host:
		return "m14-host"
	}
	return "m14"
}

func (l *lab) setup(ctx context.Context, img, sum string) error {
	var err error
	taps := len(l.ms)
	for _, m := range l.ms {
		taps += len(m.extraMACs)
	}
	l.ns, err = netns.Create(ctx, netns.Config{Prefix: l.nsPrefix(), Bridge: "br0", Taps: taps, Logger: l.log,
		BridgeAddrs: []netip.Prefix{netip.MustParsePrefix(BridgeAddr + "/24"), netip.MustParsePrefix("fd99::1/64")}})
	if err != nil {
		return fmt.Errorf("vm lab: %w", err)
	}
	l.hc = nsHTTPClient(l.ns.Name)
	l.bmcPass, l.ipmPass = randHex(8), randHex(6)

	// The OS image mirror: os.img and its SHA256SUMS over HTTP on the bridge.
	mirror, err := l.serveHTTP(http.FileServer(http.Dir(filepath.Dir(img))))
	if err != nil {
		return err
	}
	l.log.Info("os image mirror", "url", mirror, "sha256", sum)
	if l.cfg.ARM64 {
		if l.armMirror, err = l.serveHTTP(http.FileServer(http.Dir(l.armImageDir()))); err != nil {
			return err
		}
		l.log.Info("arm64 os image mirror", "url", l.armMirror)
	}

	// BMCs for the machines (l.machines).
	fixtures, err := bmcsim.FixturesDir()
	if err != nil {
		fixtures = filepath.Join(l.cfg.Root, "testdata", "fixtures")
	}
	var trees bmcsim.Trees
	nextTap := len(l.ms)
	for i, m := range l.ms {
		dir := filepath.Join(l.dir, "vms", m.name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		disk := filepath.Join(dir, "disk.raw")
		if err := os.WriteFile(disk, nil, 0o644); err != nil {
			return err
		}
		size := m.diskBytes
		if size == 0 {
			size = 4 << 30
		}
		if err := os.Truncate(disk, size); err != nil {
			return err
		}
		nics := []vmpower.NIC{{Tap: l.ns.Taps[i], MAC: m.mac}}
		for _, mac := range m.extraMACs {
			nics = append(nics, vmpower.NIC{Tap: l.ns.Taps[nextTap], MAC: mac})
			nextTap++
		}
		vcfg := vmpower.Config{Name: m.name, Dir: dir, Firmware: m.fw, MemoryMiB: m.memoryMiB(), CPUs: m.cpus(), NetworkFirst: m.networkFirst,
			UUID: fmt.Sprintf("6a1f0e3c-1414-4222-8333-%012d", i+1), Disk: disk, Netns: l.ns.Name,
			NICs: nics, Logger: l.log.With("vm", m.name)}
		if m.trust {
			if err := l.trustTune(m, &vcfg); err != nil {
				return err
			}
		}
		if m.tune != nil {
			if err := m.tune(&vcfg); err != nil {
				return fmt.Errorf("vm lab: %s: %w", m.name, err)
			}
		}
		m.vm, err = vmpower.New(vcfg)
		if err != nil {
			return fmt.Errorf("vm lab: %s: %w", m.name, err)
		}
		if m.preStart != nil {
			m.vm.SetPreStart(m.preStart)
		}
		wctx, cancel := context.WithCancel(context.Background())
		prev := l.stopWatch
		l.stopWatch = func() {
			cancel()
			if prev != nil {
				prev()
			}
		}
		l.wg.Add(1)
		go func() { defer l.wg.Done(); l.watchResets(wctx, m) }()
		switch m.driver {
		case "redfish":
			td, err := bmcsim.TreeDir(fixtures, m.tree)
			if err != nil {
				return fmt.Errorf("vm lab: %s: %w", m.name, err)
			}
			if m.vmedia {
				if td, err = noPXETree(td, filepath.Join(l.dir, "trees", m.name+"-"+m.tree+"-nopxe")); err != nil {
					return fmt.Errorf("vm lab: %s: %w", m.name, err)
				}
			}
			tr, err := trees.Load(td)
			if err != nil {
				return fmt.Errorf("vm lab: %s bmc: %w", m.name, err)
			}
			q := bmcsim.DefaultQuirks(tr.Manufacturer)
			q.NetworkFirst = m.networkFirst
			srv, err := bmcsim.New(bmcsim.Config{Tree: tr, Quirks: &q, Username: "admin", Password: l.bmcPass, Power: m.vm, SessionTimeout: -1})
			if err != nil {
				return fmt.Errorf("vm lab: %s bmc: %w", m.name, err)
			}
			m.bmc = srv
			if m.addr, err = l.serveHTTP(srv); err != nil {
				return err
			}
		case "ipmi":
			start := l.startIPMISim
			if m.pyghmi {
				start = l.startPyghmi
			}
			if err := start(m); err != nil {
				return err
			}
		}
	}

	// The inventory repository, with the lab's SSH key in the profile.
	if l.sshKeyPath, l.sshPub, err = l.sshKey(ctx); err != nil {
		return err
	}
	if err := l.writeRepo(mirror); err != nil {
		return err
	}

	// Controller: machina bootstrap makes the site (state file, master
	// key, CA, first admin token), the BMC credentials go in through the
	// TLS admin API of a repo-less serve, then the full controller runs.
	// Off loopback the admin API answers only over TLS (AdminPort), with a
	// certificate from the controller CA the harness pins; APIPort serves
	// the machines.
	site := filepath.Join(l.dir, "site")
	out, err := exec.CommandContext(ctx, l.bin("machina"), "bootstrap", "--root", site, "--admin-token-name", "lab",
		"--listen", fmt.Sprintf("%s:%d", BridgeAddr, APIPort), "--admin-listen", fmt.Sprintf("%s:%d", BridgeAddr, AdminPort),
		"--join-listen", fmt.Sprintf("%s:%d", BridgeAddr, JoinPort)).Output()
	if err != nil {
		return fmt.Errorf("vm lab: machina bootstrap: %w", err)
	}
	l.token = strings.TrimSpace(string(out))
	state := filepath.Join(site, "var/lib/machina/state.db")
	keyFile := filepath.Join(site, "etc/machina/master.key")
	caFile := filepath.Join(site, "etc/machina/ca.pem")
	caPEM, err := os.ReadFile(caFile)
	if err != nil {
		return fmt.Errorf("vm lab: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return fmt.Errorf("vm lab: %s holds no certificate", caFile)
	}
	l.hc.Transport.(*http.Transport).TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	base := fmt.Sprintf("http://%s:%d", BridgeAddr, APIPort)
	l.adminBase = fmt.Sprintf("https://%s:%d", BridgeAddr, AdminPort)
	if l.api, err = v1.NewClient(l.adminBase, l.token); err != nil {
		return err
	}
	l.api.HTTP = l.hc
	adminArgs := []string{"--master-key-file", keyFile, "--admin-listen", fmt.Sprintf("%s:%d", BridgeAddr, AdminPort)}
	if err := l.startServe(ctx, append([]string{"--state", state, "--listen", fmt.Sprintf("%s:%d", BridgeAddr, APIPort)}, adminArgs...), "serve-secrets.log"); err != nil {
		return err
	}
	for name, pw := range map[string]string{"bmc-redfish": l.bmcPass, "bmc-ipmi": l.ipmPass} {
		cmd := l.ns.Command(ctx, l.bin("machinactl"), "--api", l.adminBase, "--ca-file", caFile, "secret", "set", name, "--username", "admin", "--password-stdin")
		cmd.Env = append(os.Environ(), "MACHINA_TOKEN="+l.token)
		cmd.Stdin = strings.NewReader(pw + "\n")
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("vm lab: machinactl secret set %s: %w: %s", name, err, out)
		}
	}
	if err := l.stopServe(); err != nil {
		return err
	}

	tftp := filepath.Join(l.dir, "tftp")
	if err := os.MkdirAll(tftp, 0o755); err != nil {
		return err
	}
	for _, f := range []string{"undionly.kpxe", "snponly.efi"} {
		b, err := os.ReadFile(filepath.Join("/usr/lib/ipxe", f))
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(tftp, f), b, 0o644); err != nil {
			return err
		}
	}
	isoDir := filepath.Join(l.dir, "iso")
	if out, err := exec.CommandContext(ctx, "sh", filepath.Join(l.cfg.Root, "scripts", "metal", "build-ipxe-iso.sh"), base, isoDir).CombinedOutput(); err != nil {
		return fmt.Errorf("vm lab: build iPXE ISOs: %w: %s", err, out)
	}
	var extra []string
	if l.cfg.Trust {
		// Secure Boot servers get Debian's signed shim and GRUB
		// (boot/secureboot.go).
		extra = append(extra, "--secureboot-shim", boot.DefaultShimPath, "--secureboot-grub", boot.DefaultGRUBX64Path)
	}
	if l.cfg.ARM64 {
		// DHCP arch 11 gets grubnetaa64.efi by TFTP, which sources the
		// generated machina-grub.cfg (docs/arm64.md).
		extra = append(extra, "--grub-arm64", l.grubImage(), "--node-binary-arm64", l.bin("arm64/machina-node"))
	}
	args := append(extra, "--state", state, "--work-dir", filepath.Join(l.dir, "work"), "--iso-dir", isoDir,
		"--repo", "file://"+l.bare, "--poll-interval", "2s",
		"--listen", fmt.Sprintf("%s:%d", BridgeAddr, APIPort), "--public-url", base,
		"--join-listen", fmt.Sprintf("%s:%d", BridgeAddr, JoinPort), "--join-url", fmt.Sprintf("https://%s:%d", BridgeAddr, JoinPort),
		"--node-binary", l.bin("machina-node"), "--heartbeat", "5s",
		// No switch on the five-VM lab's bridge sends LLDP: a short listen
		// keeps commissioning from waiting out the 32 s default for
		// nothing; the host lab's lldpd sends every second (lldpWait).
		"--lldp-wait", l.lldpWait(),
		// The silence watchdog is a deadline too: under TimeScale (a loaded
		// machine) a deploy's image write and two-pass check outlast the
		// default 5 minutes, and a re-netboot would restart it.
		"--machine-silent-after", l.scale(5*time.Minute).String(),
		"--dhcp-interface", l.ns.Bridge, "--dhcp-subnet", Subnet, "--dhcp-pool", Pool, "--tftp-root", tftp,
		"--ramdisk-dir", filepath.Join(l.cfg.Root, "out", "ramdisk"))
	l.serveArgs = append(args, adminArgs...)
	return l.startServe(ctx, l.serveArgs, "controller.log")
}

// serveHTTP serves h on an ephemeral port of the bridge address inside the
// namespace and returns its base URL.
func (l *lab) serveHTTP(h http.Handler) (string, error) {
	ln, err := listenIn(l.ns.Name, BridgeAddr+":0")
	if err != nil {
		return "", fmt.Errorf("vm lab: listen in namespace: %w", err)
	}
	hs := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	l.servers = append(l.servers, hs)
	l.wg.Add(1)
	go func() { defer l.wg.Done(); _ = hs.Serve(ln) }()
	return "http://" + ln.Addr().String(), nil
}

func (l *lab) startIPMISim(m *machine) error {
	dir := filepath.Join(l.dir, "ipmi", m.name)
	if err := os.MkdirAll(filepath.Join(dir, "state"), 0o700); err != nil {
		return err
	}
	addr := netip.AddrPortFrom(netip.MustParseAddr(BridgeAddr), IPMIPort)
	lan, err := ipmichassis.LanConf(ipmichassis.LanConfig{Name: "lab" + strings.ReplaceAll(m.name, "-", ""), Addr: addr, User: "admin", Password: l.ipmPass,
		Program: l.bin("lab-chassis-control"), VMDir: m.vm.Config().Dir})
	if err != nil {
		return fmt.Errorf("vm lab: ipmi_sim config: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "lan.conf"), lan, 0o600); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "bmc.emu"), ipmichassis.EmuConf(), 0o600); err != nil {
		return err
	}
	logf, err := os.Create(filepath.Join(l.dir, "ipmi_sim-"+m.name+".log"))
	if err != nil {
		return err
	}
	cmd := l.ns.Command(context.Background(), "ipmi_sim", "-c", filepath.Join(dir, "lan.conf"), "-f", filepath.Join(dir, "bmc.emu"), "-s", filepath.Join(dir, "state"), "-n")
	cmd.Stdout, cmd.Stderr = logf, logf
	if _, err := l.ns.Start(cmd); err != nil {
		return fmt.Errorf("vm lab: ipmi_sim: %w", err)
	}
	m.addr = addr.String()
	return nil
}

// startPyghmi starts m's pyghmi BMC inside the namespace on
// BridgeAddr:PyghmiPort (internal/pyghmibmc), with the VM lab's own
// lab-chassis-control over m's vmpower directory as its power backend (the
// program ipmi_sim runs for vm-ipmi: one QMP client and one boot-order
// implementation for both BMCs) and the boot device applied at the next
// power-on, as VirtualBMC over libvirt.
func (l *lab) startPyghmi(m *machine) error {
	dir := filepath.Join(l.dir, "pyghmi", m.name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	b, err := bmcproc.Launch(bmcproc.Config{Dir: dir, Address: BridgeAddr, Port: PyghmiPort, Netns: l.ns.Name,
		User: "admin", Password: l.ipmPass, ApplyAtPowerOn: true,
		Power: "chassis:" + l.bin("lab-chassis-control") + " " + m.vm.Config().Dir})
	if err != nil {
		return fmt.Errorf("vm lab: %s pyghmi bmc: %w", m.name, err)
	}
	m.pyBMC, m.addr = b, b.Addr()
	return nil
}

// Quirks the controller must learn from vm-pyghmi's BMC (bmc.BootQuirk
// values, rendered in status bmcQuirks).
const (
	bmcQuirkBootFlags = "bootFlagsNotPersistent"
	bmcQuirkAtPowerOn = "bootDeviceAtPowerOn"
)

// pyghmiQuirks checks that the controller learned vm-pyghmi's BMC quirks
// (status commit bmcQuirks) and that the BMC booted the machine with the
// disk at a power-on after its network boots: the reconciler powered it
// off and on, as a reset would have kept the network device.
func (l *lab) pyghmiQuirks(ctx context.Context) error {
	for _, q := range []string{bmcQuirkBootFlags, bmcQuirkAtPowerOn} {
		if err := l.waitStatus(ctx, gitops.ServerStatusPath(PyghmiMachine), q); err != nil {
			return err
		}
	}
	var m *machine
	for _, x := range l.ms {
		if x.name == PyghmiMachine {
			m = x
		}
	}
	if m == nil || m.pyBMC == nil {
		return fmt.Errorf("vm lab: no pyghmi BMC for %s", PyghmiMachine)
	}
	boots, err := m.pyBMC.Boots()
	if err != nil {
		return fmt.Errorf("vm lab: %s boot log: %w", PyghmiMachine, err)
	}
	net := slices.Index(boots, "power-on network")
	if net < 0 || !slices.Contains(boots[net:], "power-on hd") {
		return fmt.Errorf("vm lab: %s: boots %q: want a power-on with hd after one with network", PyghmiMachine, boots)
	}
	l.log.Info("pyghmi bmc boots", "vm", PyghmiMachine, "boots", boots)
	return nil
}

// startServe runs `machina serve args...` inside the namespace, logging to
// file, and waits until its API answers /healthz.
func (l *lab) startServe(ctx context.Context, args []string, logName string) error {
	logf, err := os.OpenFile(filepath.Join(l.dir, logName), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := l.ns.Command(context.Background(), l.bin("machina"), append([]string{"serve", "--log-format", "text"}, args...)...)
	cmd.Stdout, cmd.Stderr = logf, logf
	p, err := l.ns.Start(cmd)
	if err != nil {
		return fmt.Errorf("vm lab: machina serve: %w", err)
	}
	l.serve = p
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := l.hc.Get(fmt.Sprintf("http://%s:%d/healthz", BridgeAddr, APIPort))
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return nil
			}
		}
		select {
		case <-p.Done():
			return fmt.Errorf("vm lab: machina serve exited: %v (see %s)", p.Err(), logName)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("vm lab: machina serve not answering within 60s (see %s)", logName)
		}
	}
}

func (l *lab) stopServe() error {
	if l.serve == nil {
		return nil
	}
	p := l.serve
	l.serve = nil
	_ = p.Cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.Done():
		return nil
	case <-time.After(20 * time.Second):
		_ = p.Cmd.Process.Kill()
		<-p.Done()
		return errors.New("vm lab: machina serve did not stop on SIGTERM within 20s")
	}
}

func (l *lab) close() {
	if err := l.stopServe(); err != nil {
		l.log.Warn("stop controller", "err", err)
	}
	if l.stopWatch != nil {
		l.stopWatch()
	}
	for _, m := range l.ms {
		if m.pyBMC != nil {
			m.pyBMC.Stop()
		}
		if m.vm != nil {
			_ = m.vm.Reset(context.Background(), "ForceOff")
		}
		m.tpm.stop()
	}
	l.closeSpoofer()
	for _, hs := range l.servers {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_ = hs.Shutdown(ctx)
		cancel()
	}
	l.wg.Wait()
	if l.ns != nil {
		if err := l.ns.Close(); err != nil {
			l.log.Warn("delete namespace", "err", err)
		}
	}
}

func (l *lab) listServers() ([]v1.Server, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	list, err := l.api.ListServers(ctx, v1.ListServersOptions{})
	return list.Servers, err
}

// waitServers polls the API until cond holds, the deadline passes or the
// controller exits.
func (l *lab) waitServers(ctx context.Context, what string, d time.Duration, cond func([]v1.Server) error) error {
	deadline := time.Now().Add(d)
	var last error
	for {
		ss, err := l.listServers()
		if err == nil {
			if last = cond(ss); last == nil {
				return nil
			}
			if strings.Contains(last.Error(), "failed") {
				return fmt.Errorf("vm lab: %s: %w", what, last)
			}
		} else {
			last = err
		}
		if l.serve != nil {
			select {
			case <-l.serve.Done():
				return fmt.Errorf("vm lab: %s: controller exited: %v", what, l.serve.Err())
			default:
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("vm lab: %s: not reached within %s: %v", what, d, last)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

func (l *lab) waitHosts(ctx context.Context, names []string, d time.Duration) error {
	deadline := time.Now().Add(d)
	var last string
	for {
		c, cancel := context.WithTimeout(ctx, 20*time.Second)
		hosts, err := l.api.Hosts(c)
		cancel()
		if err == nil {
			ok := 0
			var st []string
			for _, h := range hosts.Items {
				st = append(st, fmt.Sprintf("%s:%s(%s)nets=%v", h.Server, h.JoinStatus, h.JoinReason, h.Networks))
				for _, n := range names {
					if (h.Server == n || h.Name == n) && h.JoinStatus == "joined" && len(h.Networks) > 0 {
						ok++
					}
				}
			}
			if ok == len(names) {
				for _, n := range names {
					if err := l.waitStatus(ctx, "status/hosts/"+n+".yaml", "joined"); err != nil {
						return err
					}
				}
				return nil
			}
			last = strings.Join(st, " ")
		} else {
			last = err.Error()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("vm lab: hosts joined: not within %s: %s", d, last)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(2 * time.Second):
		}
	}
}

// waitStatus waits until the bare repository's main branch has path
// containing text (a status commit of the controller).
func (l *lab) waitStatus(ctx context.Context, path, text string) error {
	deadline := time.Now().Add(l.scale(90 * time.Second))
	for {
		if body, ok := readHead(l.bare, path); ok && strings.Contains(body, text) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("vm lab: no status commit with %s containing %q", path, text)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

func readHead(bare, path string) (string, bool) {
	repo, err := git.PlainOpen(bare)
	if err != nil {
		return "", false
	}
	ref, err := repo.Head()
	if err != nil {
		return "", false
	}
	c, err := repo.CommitObject(ref.Hash())
	if err != nil {
		return "", false
	}
	f, err := c.File(path)
	if err != nil {
		return "", false
	}
	s, err := f.Contents()
	return s, err == nil
}

func replaceFile(path, old, new string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if !bytes.Contains(b, []byte(old)) {
		return fmt.Errorf("vm lab: %s does not contain %q", path, old)
	}
	return os.WriteFile(path, bytes.Replace(b, []byte(old), []byte(new), 1), 0o644)
}

// writeRepo creates the bare inventory repository and the operator's clone
// with the five servers, the lab profile (count 0) and the lab-os image.
func (l *lab) writeRepo(mirror string) error {
	l.bare, l.clone = filepath.Join(l.dir, "repo.git"), filepath.Join(l.dir, "inventory")
	if _, err := git.PlainInitWithOptions(l.bare, &git.PlainInitOptions{Bare: true, InitOptions: git.InitOptions{DefaultBranch: "refs/heads/main"}}); err != nil {
		return fmt.Errorf("vm lab: init repo: %w", err)
	}
	repo, err := git.PlainInitWithOptions(l.clone, &git.PlainInitOptions{InitOptions: git.InitOptions{DefaultBranch: "refs/heads/main"}})
	if err != nil {
		return fmt.Errorf("vm lab: init clone: %w", err)
	}
	if _, err := repo.CreateRemote(&gitconfig.RemoteConfig{Name: "origin", URLs: []string{"file://" + l.bare}}); err != nil {
		return err
	}
	if err := repo.CreateBranch(&gitconfig.Branch{Name: "main", Remote: "origin", Merge: "refs/heads/main"}); err != nil {
		return err
	}
	var sb strings.Builder
	sb.WriteString("# The VM lab: qemu VMs on the lab bridge.\nservers:\n")
	for _, m := range l.ms {
		mode, cred := "bios", "bmc-redfish"
		if m.fw == vmpower.UEFI || m.fw == vmpower.UEFIARM64 {
			mode = "uefi"
		}
		if m.driver == "ipmi" {
			cred = "bmc-ipmi"
		}
		fmt.Fprintf(&sb, "  - name: %s\n    zone: %s\n    bootMAC: %q\n    bootMode: %s\n    bmc:\n      driver: %s\n      address: %q\n      credentials: %s\n",
			m.name, m.zone, m.mac, mode, m.driver, m.addr, cred)
		if m.trust {
			sb.WriteString("    profile: " + TrustProfile + "\n")
		}
	}
	files := map[string]string{
		"servers.yaml": sb.String(),
		"profiles.yaml": `profiles:
  - name: ` + ProfileName + `
    image: ` + ImageName + `
    deploy: image
    sshKeys:
      - "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIO4VqFGm2ahY3KSc9k9lrQMD0j2/tR46oEgCPUxiE9s7 ops@lab"
      - "` + l.sshPub + `"
    zone: lab
    min: {cores: 1, memoryGiB: 1, diskGiB: 2}
    count: 0
    join:
      site: vmlab
      tags: [vm]
      networks:
        - {name: lab, bridge: br-lab, nic: ` + GuestNIC + `, cidr: ` + Subnet + `}
`,
		"images.yaml": fmt.Sprintf("images:\n  - name: %s\n    url: %s/%s\n    checksumURL: %s/%s\n", ImageName, mirror, osimage.ImageFile, mirror, osimage.SumsFile) + l.armImageYAML(),
		"README.md":   "# VM lab inventory\n",
	}
	files["profiles.yaml"] += l.armProfileYAML() + l.trustProfileYAML()
	if l.cfg.Host {
		files = l.hostRepoFiles(mirror)
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(l.clone, name), []byte(body), 0o644); err != nil {
			return err
		}
	}
	wt, err := repo.Worktree()
	if err != nil {
		return err
	}
	if err := wt.AddGlob("."); err != nil {
		return err
	}
	sig := &object.Signature{Name: "Lab Operator", Email: "operator@lab.invalid", When: time.Now()}
	if _, err := wt.Commit("inventory: VM lab", &git.CommitOptions{Author: sig, Committer: sig}); err != nil {
		return err
	}
	return repo.Push(&git.PushOptions{RemoteName: "origin", RefSpecs: []gitconfig.RefSpec{"refs/heads/main:refs/heads/main"}})
}

// GuestNIC is the name the lab OS image gives every VM's virtio NIC: its
// kernel command line has net.ifnames=0 (lab/vm/osimage/build.sh), on BIOS
// and UEFI alike.
const GuestNIC = "eth0"

// push pulls the controller's status commits into the clone, applies edit,
// commits and pushes, then asks the controller to reconcile now. The
// controller pushes status commits on its own schedule (a restarted one
// commits right after start), so a push can race one and be refused as a
// non-fast-forward update: push then resets the clone to the remote's main
// and applies edit again, up to pushAttempts times. edit must therefore
// work on a fresh checkout each time (replaceFile does).
func (l *lab) push(ctx context.Context, msg string, edit func() error) error {
	repo, err := git.PlainOpen(l.clone)
	if err != nil {
		return err
	}
	wt, err := repo.Worktree()
	if err != nil {
		return err
	}
	for attempt := 1; ; attempt++ {
		err := l.pushOnce(repo, wt, msg, edit)
		if err == nil {
			break
		}
		if attempt == pushAttempts || !strings.Contains(err.Error(), "non-fast-forward") {
			return err
		}
		l.log.Info("push raced a status commit; again on the remote's main", "attempt", attempt, "err", err)
		if err := repo.FetchContext(ctx, &git.FetchOptions{RemoteName: "origin"}); err != nil && !errors.Is(err, git.NoErrAlreadyUpToDate) {
			return fmt.Errorf("vm lab: fetch: %w", err)
		}
		remote, err := repo.Reference(plumbing.NewRemoteReferenceName("origin", "main"), true)
		if err != nil {
			return fmt.Errorf("vm lab: %w", err)
		}
		if err := wt.Reset(&git.ResetOptions{Commit: remote.Hash(), Mode: git.HardReset}); err != nil {
			return fmt.Errorf("vm lab: reset to origin/main: %w", err)
		}
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, l.adminBase+"/api/v1/reconcile", nil)
	req.Header.Set("Authorization", "Bearer "+l.token)
	if resp, err := l.hc.Do(req); err == nil {
		resp.Body.Close()
	}
	return nil
}

// pushAttempts bounds push's retries after a non-fast-forward refusal.
const pushAttempts = 5

// pushOnce pulls, applies edit, commits and pushes once.
func (l *lab) pushOnce(repo *git.Repository, wt *git.Worktree, msg string, edit func() error) error {
	if err := wt.Pull(&git.PullOptions{RemoteName: "origin"}); err != nil && !errors.Is(err, git.NoErrAlreadyUpToDate) {
		return fmt.Errorf("vm lab: pull: %w", err)
	}
	if err := edit(); err != nil {
		return err
	}
	if err := wt.AddGlob("."); err != nil {
		return err
	}
	sig := &object.Signature{Name: "Lab Operator", Email: "operator@lab.invalid", When: time.Now()}
	if _, err := wt.Commit(msg, &git.CommitOptions{Author: sig, Committer: sig}); err != nil {
		return err
	}
	if err := repo.Push(&git.PushOptions{RemoteName: "origin"}); err != nil {
		return fmt.Errorf("vm lab: push: %w", err)
	}
	return nil
}

// isoName is the iPXE ISO (scripts/metal/build-ipxe-iso.sh) the
// controller must insert for m's boot mode.
func (m *machine) isoName() string {
	if m.fw == vmpower.UEFI {
		return "machina-ipxe-uefi.iso"
	}
	return "machina-ipxe-bios.iso"
}

// insertedMedia checks that m's emulated BMC accepted an InsertMedia, and
// only of the ISO for m's boot mode.
func (l *lab) insertedMedia(m *machine) error {
	var images []string
	for _, r := range m.bmc.Requests() {
		if r.Method == http.MethodPost && strings.HasSuffix(r.Path, "/Actions/VirtualMedia.InsertMedia") && r.Status/100 == 2 {
			img, _ := r.Body["Image"].(string)
			images = append(images, img)
		}
	}
	if len(images) == 0 {
		return fmt.Errorf("vm lab: %s commissioned without a VirtualMedia.InsertMedia request to its BMC", m.name)
	}
	for _, img := range images {
		if !strings.HasSuffix(img, "/"+m.isoName()) {
			return fmt.Errorf("vm lab: %s (%s) got virtual media %q, want .../%s", m.name, m.fw, img, m.isoName())
		}
	}
	l.log.Info("virtual media", "vm", m.name, "images", images)
	return nil
}

// noPXETree copies the Redfish tree at src to dst with "Pxe" removed from
// the System's Boot.BootSourceOverrideTarget@Redfish.AllowableValues: a BMC
// that cannot PXE-boot its host, which the controller must boot from the
// iPXE ISO over virtual media instead (reconciler netboot).
func noPXETree(src, dst string) (string, error) {
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return "", err
	}
	if out, err := exec.Command("cp", "-a", src+"/.", dst).CombinedOutput(); err != nil {
		return "", fmt.Errorf("copy tree: %w: %s", err, out)
	}
	sys, err := filepath.Glob(filepath.Join(dst, "redfish", "v1", "Systems", "*", "index.json"))
	if err != nil || len(sys) == 0 {
		return "", fmt.Errorf("copy tree: no System in %s", dst)
	}
	const pxe = "\"Pxe\","
	for _, f := range sys {
		b, err := os.ReadFile(f)
		if err != nil {
			return "", err
		}
		i := bytes.Index(b, []byte("\"BootSourceOverrideTarget@Redfish.AllowableValues\""))
		if i < 0 {
			return "", fmt.Errorf("copy tree: %s has no boot target list", f)
		}
		j := bytes.Index(b[i:], []byte(pxe))
		k := bytes.IndexByte(b[i:], ']')
		if j < 0 || j > k {
			return "", fmt.Errorf("copy tree: %s lists no Pxe target", f)
		}
		b = append(b[:i+j:i+j], b[i+j+len(pxe):]...)
		if err := os.WriteFile(f, b, 0o644); err != nil {
			return "", err
		}
	}
	return dst, nil
}

// watchResets makes m's BMC apply a changed boot device at the guest's own
// reboot, as a physical BMC's boot override does: qemu fixes its boot
// order at process start, so on a guest-initiated RESET (QMP event, data
// {"guest": true}) whose stored boot device differs from the one the
// process started with, it restarts the VM (vmpower ForceRestart, which
// restarts the process in that case). Without it a VM deployed after a
// one-time PXE boot would reboot into PXE again; OVMF's iPXE cannot "exit"
// to the disk from there.
func (l *lab) watchResets(ctx context.Context, m *machine) {
	log := l.log.With("vm", m.name)
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if m.vm.Pid() == 0 {
			continue
		}
		c, err := m.vm.QMP(ctx)
		if err != nil {
			continue
		}
		l.followResets(ctx, m, c, log)
		c.Close()
	}
}

func (l *lab) followResets(ctx context.Context, m *machine, c *qmp.Client, log *slog.Logger) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.Done():
			return
		case ev, ok := <-c.Events():
			if !ok {
				return
			}
			if ev.Name != "RESET" {
				continue
			}
			var data struct {
				Guest bool `json:"guest"`
			}
			_ = json.Unmarshal(ev.Data, &data)
			started, _ := os.ReadFile(filepath.Join(m.vm.Config().Dir, vmpower.StartedBootFile))
			dev := m.vm.EffectiveBootDevice()
			if !data.Guest || vmpower.BootDevice(strings.TrimSpace(string(started))) == dev {
				continue
			}
			log.Info("guest reboot with a changed boot device: restarting the VM", "started", strings.TrimSpace(string(started)), "now", dev)
			c.Close()
			rctx, cancel := context.WithTimeout(ctx, time.Minute)
			if err := m.vm.Reset(rctx, "ForceRestart"); err != nil {
				log.Warn("restart after guest reboot", "err", err)
			}
			cancel()
			return
		}
	}
}

// approveHeld waits until the controller's plan holds steps behind the
// brake, then approves the current inventory revision (POST /api/v1/approve
// with its digest), as an operator does.
func (l *lab) approveHeld(ctx context.Context) error {
	base := l.adminBase
	get := func(path string, v any) error {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+path, nil)
		req.Header.Set("Authorization", "Bearer "+l.token)
		resp, err := l.hc.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("GET %s: %s", path, resp.Status)
		}
		return json.NewDecoder(resp.Body).Decode(v)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		var plan struct {
			Held  []json.RawMessage `json:"held"`
			Brake string            `json:"brake"`
		}
		if err := get("/api/v1/plan", &plan); err == nil && len(plan.Held) > 0 {
			var inv struct {
				Good struct{ Commit, Digest string }
			}
			if err := get("/api/v1/inventory", &inv); err != nil {
				return fmt.Errorf("vm lab: inventory status: %w", err)
			}
			l.log.Info("plan held by the brake; approving", "held", len(plan.Held), "brake", plan.Brake, "digest", inv.Good.Digest)
			body, _ := json.Marshal(map[string]string{"revision": inv.Good.Digest})
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/api/v1/approve", bytes.NewReader(body))
			req.Header.Set("Authorization", "Bearer "+l.token)
			req.Header.Set("Content-Type", "application/json")
			resp, err := l.hc.Do(req)
			if err != nil {
				return fmt.Errorf("vm lab: approve: %w", err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("vm lab: approve: %s", resp.Status)
			}
			return nil
		}
		if time.Now().After(deadline) {
			return errors.New("vm lab: the release was never held by the brake (it releases more than the 20% of servers a revision may)")
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// hostLostAndBack freezes server's VM with QMP stop (the guest and its
// node agent stop; the BMC still reads the VM running), waits for the
// controller to mark its host HostLost with the power read "lost, powered
// on" (heartbeat 5s: lost window 15s), resumes it with QMP cont and waits
// for the heartbeats to clear the condition.
func (l *lab) hostLostAndBack(ctx context.Context, server string) error {
	var m *machine
	for _, x := range l.ms {
		if x.name == server {
			m = x
		}
	}
	if m == nil || m.vm == nil {
		return fmt.Errorf("vm lab: liveness: no VM for %s", server)
	}
	// Through vmpower's control socket: the monitor socket (VM.QMP) is
	// held by the lab's reset follower, and a QMP socket serves one client.
	if err := m.vm.Pause(ctx); err != nil {
		return fmt.Errorf("vm lab: liveness: QMP stop %s: %w", server, err)
	}
	resumed := false
	defer func() {
		if !resumed {
			_ = m.vm.Resume(context.WithoutCancel(ctx))
		}
	}()
	lost := func(want bool) (string, error) {
		cc, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		hs, err := l.api.Hosts(cc)
		if err != nil {
			return err.Error(), nil
		}
		for _, h := range hs.Items {
			if h.Server != server && h.Name != server {
				continue
			}
			switch {
			case want && h.Lost != nil && h.Lost.Summary == "lost, powered on":
				return "", nil
			case !want && h.Lost == nil && h.Online:
				return "", nil
			}
			return fmt.Sprintf("%s lost=%+v online=%v", h.Name, h.Lost, h.Online), errNotYet
		}
		return "no host for " + server, errNotYet
	}
	wait := func(what string, want bool, d time.Duration) error {
		deadline := time.Now().Add(d)
		for {
			last, err := lost(want)
			if err == nil && last == "" {
				return nil
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("vm lab: liveness: %s: not within %s: %s", what, d, last)
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(time.Second):
			}
		}
	}
	if err := wait(server+" HostLost, powered on", true, 2*time.Minute); err != nil {
		return err
	}
	if err := m.vm.Resume(ctx); err != nil {
		return fmt.Errorf("vm lab: liveness: QMP cont %s: %w", server, err)
	}
	resumed = true
	if err := wait(server+" heartbeating again", false, 2*time.Minute); err != nil {
		return err
	}
	return l.waitStatus(ctx, "status/hosts/"+server+".yaml", "state: joined")
}

var errNotYet = errors.New("not yet")

// networkFirstBooted checks, for each network-first machine
// (machine.networkFirst, which must be among the deployed), that it reached
// its disk through the deployed machine's iPXE script: its serial console
// shows the deployed script, then iPXE booting drive 0x80 (sanboot) or the
// chain wrapper leaving iPXE, and never the wrapper's retry ("boot script
// not available"), which would mean it looped; the join (checked before)
// proves the disk booted. It returns a note for the step name.
func (l *lab) networkFirstBooted(deployed []string) (string, error) {
	var note string
	for _, m := range l.ms {
		if !m.networkFirst {
			continue
		}
		if !slices.Contains(deployed, m.name) {
			return "", fmt.Errorf("vm lab: network-first machine %s was not among the deployed (%s): the boot-from-disk path was not exercised", m.name, strings.Join(deployed, ", "))
		}
		b, err := os.ReadFile(filepath.Join(l.dir, "vms", m.name, vmpower.SerialLog))
		if err != nil {
			return "", fmt.Errorf("vm lab: %s serial log: %w", m.name, err)
		}
		con := string(b)
		i := strings.Index(con, "lifecycle=deployed")
		switch {
		case i < 0:
			return "", fmt.Errorf("vm lab: %s (network first) joined without running the deployed iPXE script: its boot order did not stay network-first", m.name)
		case !strings.Contains(con[i:], "Booting from SAN device 0x80") && !strings.Contains(con[i:], "Machina: leaving iPXE"):
			return "", fmt.Errorf("vm lab: %s (network first): the deployed script ran but iPXE neither booted drive 0x80 nor left for the next boot device", m.name)
		case strings.Contains(con[i:], "boot script not available"):
			return "", fmt.Errorf("vm lab: %s (network first): the chain wrapper retried after the boot-from-disk answer", m.name)
		}
		how := "iPXE booted drive 0x80 (sanboot)"
		if !strings.Contains(con[i:], "Booting from SAN device 0x80") {
			how = "iPXE left for the firmware's next boot device"
		}
		note += fmt.Sprintf("; %s booted network first (boot override ignored), got the deployed script %d times, %s", m.name, strings.Count(con[i:], "lifecycle=deployed"), how)
	}
	return note, nil
}
