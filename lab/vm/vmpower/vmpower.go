// Package vmpower is the power, boot-device and virtual-media backend of a
// qemu VM in the lab: what a BMC would do to a physical server, done to a
// qemu process through QMP and process control.
//
// All state lives in one directory (Config.Dir): vm.json (the Config),
// qemu.pid, qmp.sock, serial.log, bootdev, media and, for UEFI, vars.fd. Any
// process can therefore operate the same VM: the in-process Redfish emulator
// backend ([VM] implements bmcsim.PowerBackend's method set) and the
// chassis_control program ipmi_sim runs for every IPMI chassis command
// (cmd/lab-chassis-control, [ChassisControl]).
//
// Power on starts qemu with -daemonize -pidfile, so qemu never inherits the
// caller's pipes (LAB-NOTES §3.1: ipmi_sim reads the program's output to
// EOF) and the QMP socket is listening when the start returns. Power off is
// QMP quit, then SIGTERM/SIGKILL to the pid qemu wrote, after checking that
// the pid still runs a qemu of this directory. Boot device: qemu's boot
// order is fixed at process start (fw_cfg "bootorder" from the bootindex
// properties, read by SeaBIOS and OVMF), so a changed boot device takes
// effect at the next power on, power cycle, or ForceRestart (which then
// restarts the process instead of system_reset). Virtual media uses QMP
// blockdev-change-medium on the ide-cd "cdrom0" (LAB-NOTES §4), and is
// re-inserted when qemu is restarted.
//
// Never -accel kvm: /dev/kvm on the lab machines is nested PVM and runs
// guests far slower than TCG (LAB-NOTES §1.1). Config.Accel defaults to tcg.
//
// The package imports only lab/vm/qmp from the project.
package vmpower

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/machina-metal/machina/lab/vm/qmp"
	"golang.org/x/sys/unix"
)

// Sentinel errors.
var (
	// ErrInvalidConfig is returned by New and Open for a Config that fails
	// validation (names, paths, MACs, firmware, boot device).
	ErrInvalidConfig = errors.New("vmpower: invalid config")
	// ErrUnsupportedReset is returned by Reset for a ResetType this backend
	// does not model.
	ErrUnsupportedReset = errors.New("vmpower: unsupported reset type")
	// ErrPoweredOff is returned by operations that need a running VM.
	ErrPoweredOff = errors.New("vmpower: vm is powered off")
)

// Firmware selects SeaBIOS (pc machine), OVMF (q35 machine) or, for an
// arm64 VM, AAVMF (qemu-system-aarch64's virt machine, -cpu max).
type Firmware string

// Firmware values.
const (
	BIOS      Firmware = "bios"
	UEFI      Firmware = "uefi"
	UEFIARM64 Firmware = "uefi-arm64"
)

// BootDevice is the device the next power on boots from.
type BootDevice string

// BootDevice values; the zero value means BootDisk.
const (
	BootDisk BootDevice = "disk"
	BootPXE  BootDevice = "pxe"
	BootCD   BootDevice = "cd"
)

// NIC is one virtio-net NIC on a tap device.
type NIC struct {
	// Tap is the tap device name (inside Config.Netns when set).
	Tap string `json:"tap"`
	// MAC is the NIC's address, e.g. "52:54:00:12:34:56".
	MAC string `json:"mac"`
	// Options are more virtio-net-pci properties, comma-separated, e.g.
	// "csum=off" (the guest computes its checksums and sends no TSO
	// frames: what a user-space forwarder on the tap needs). Letters,
	// digits, "_", "=", "," and "-" only.
	Options string `json:"options,omitempty"`
}

var nicOptsRE = regexp.MustCompile(`^[A-Za-z0-9_=,-]*$`)

// Config describes one VM. It is stored as Dir/vm.json by New.
type Config struct {
	// Name is the qemu -name, 1..32 of [a-z0-9-].
	Name string `json:"name"`
	// Dir holds the VM's state files; created by New. Must be absolute.
	Dir string `json:"dir"`
	// QEMU is the qemu binary; zero means "qemu-system-x86_64".
	QEMU string `json:"qemu,omitempty"`
	// Accel is the -accel value; zero means "tcg".
	Accel string `json:"accel,omitempty"`
	// Firmware is BIOS (SeaBIOS, -machine pc) or UEFI (OVMF, -machine q35);
	// zero means BIOS.
	Firmware Firmware `json:"firmware,omitempty"`
	// OVMFCode and OVMFVars are the OVMF flash images for UEFI; zero means
	// OVMF_CODE_4M.fd / OVMF_VARS_4M.fd from the Debian ovmf package. Vars
	// is copied to Dir/vars.fd once.
	OVMFCode string `json:"ovmfCode,omitempty"`
	OVMFVars string `json:"ovmfVars,omitempty"`
	// MemoryMiB is the guest memory; zero means 1024.
	MemoryMiB int `json:"memoryMiB,omitempty"`
	// CPUs is -smp; zero means 2.
	CPUs int `json:"cpus,omitempty"`
	// UUID is the SMBIOS system UUID; zero means none.
	UUID string `json:"uuid,omitempty"`
	// Disk is the disk image on virtio-blk; zero means no disk.
	Disk string `json:"disk,omitempty"`
	// DiskFormat is "raw" or "qcow2"; zero means qcow2 for a .qcow2 name,
	// raw otherwise.
	DiskFormat string `json:"diskFormat,omitempty"`
	// NICs are virtio-net NICs on taps; zero means none.
	NICs []NIC `json:"nics,omitempty"`
	// Netns runs qemu inside this network namespace (ip netns exec); zero
	// means the caller's namespace.
	Netns string `json:"netns,omitempty"`
	// BootDevice is the boot device before any SetBootDevice; zero means
	// BootDisk.
	BootDevice BootDevice `json:"bootDevice,omitempty"`
	// NetworkFirst keeps the NIC first in the boot order whatever boot
	// device is set: SetBootDevice is stored and reads back (BootDevice),
	// but every start boots the network first, then the disk. Servers whose
	// BIOS/UEFI boot order lists PXE first and whose BMC drops or never
	// applies the boot override behave so, as do libvirt domains whose
	// <boot order> puts the NIC first behind VirtualBMC or sushy-tools: a
	// deployed machine then reaches its disk only through its boot script.
	NetworkFirst bool `json:"networkFirst,omitempty"`
	// ExtraArgs are appended to the qemu command line (trusted input).
	ExtraArgs []string `json:"extraArgs,omitempty"`
	// Paused starts qemu with -S (vCPUs stopped until Cont); for tests.
	Paused bool `json:"paused,omitempty"`
	// QuitTimeout bounds the wait for qemu to exit after quit or SIGTERM
	// before SIGKILL; zero means 500ms (ipmi_sim needs chassis_control to
	// answer within about 1 s, LAB-NOTES §3.1).
	QuitTimeout time.Duration `json:"quitTimeout,omitempty"`
	// GracefulTimeout bounds GracefulRestart's wait for the guest to power
	// off after the ACPI button before it is forced; zero means 60s.
	GracefulTimeout time.Duration `json:"gracefulTimeout,omitempty"`
	// Logger gets one Info line per power, boot or media change; nil
	// discards. Not stored in vm.json.
	Logger *slog.Logger `json:"-"`
}

// State file names inside Config.Dir.
const (
	ConfigFile = "vm.json"
	PIDFile    = "qemu.pid"
	QMPSocket  = "qmp.sock"
	// MonitorSocket is a second QMP monitor for callers ([VM.QMP]): a qemu
	// socket monitor serves one client at a time, and QMPSocket is kept
	// for this package's short control sessions.
	MonitorSocket = "monitor.sock"
	SerialLog     = "serial.log"
	BootDevFile   = "bootdev"
	MediaFile     = "media"
	VarsFile      = "vars.fd"
	// StartedBootFile records the boot device the running qemu started with.
	StartedBootFile = "bootdev.started"
	// CDROMID is the qdev id of the removable CD-ROM every VM gets.
	CDROMID = "cdrom0"
)

var (
	nameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,31}$`)
	ifRE   = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,14}$`)
	uuidRE = regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)
)

// safePath rejects paths qemu's option parser would split (',' separates
// options) or that are not absolute.
func safePath(p string) error {
	if !filepath.IsAbs(p) || strings.ContainsAny(p, ",\n\x00") {
		return fmt.Errorf("path %q must be absolute without ',' or newlines", p)
	}
	return nil
}

func (c *Config) setDefaults() {
	if c.QEMU == "" {
		c.QEMU = "qemu-system-x86_64"
		if c.Firmware == UEFIARM64 {
			c.QEMU = "qemu-system-aarch64"
		}
	}
	if c.Accel == "" {
		c.Accel = "tcg"
	}
	if c.Firmware == "" {
		c.Firmware = BIOS
	}
	if c.MemoryMiB == 0 {
		c.MemoryMiB = 1024
	}
	if c.CPUs == 0 {
		c.CPUs = 2
	}
	if c.BootDevice == "" {
		c.BootDevice = BootDisk
	}
	if c.QuitTimeout == 0 {
		c.QuitTimeout = 500 * time.Millisecond
	}
	if c.GracefulTimeout == 0 {
		c.GracefulTimeout = 60 * time.Second
	}
	if c.DiskFormat == "" && c.Disk != "" {
		c.DiskFormat = "raw"
		if strings.HasSuffix(c.Disk, ".qcow2") {
			c.DiskFormat = "qcow2"
		}
	}
}

func (c *Config) validate() error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if !nameRE.MatchString(c.Name) {
		bad("name %q: want 1..32 of [a-z0-9-]", c.Name)
	}
	if err := safePath(c.Dir); err != nil {
		bad("dir: %v", err)
	}
	if c.Accel == "kvm" || strings.HasPrefix(c.Accel, "kvm,") {
		bad("accel %q: the lab runs TCG only (nested PVM kvm is unusable)", c.Accel)
	}
	if c.Firmware != BIOS && c.Firmware != UEFI && c.Firmware != UEFIARM64 {
		bad("firmware %q: want bios, uefi or uefi-arm64", c.Firmware)
	}
	if c.MemoryMiB < 64 || c.MemoryMiB > 65536 || c.CPUs < 1 || c.CPUs > 64 {
		bad("memory %d MiB / cpus %d out of range", c.MemoryMiB, c.CPUs)
	}
	if c.UUID != "" && !uuidRE.MatchString(c.UUID) {
		bad("uuid %q", c.UUID)
	}
	if c.Disk != "" {
		if err := safePath(c.Disk); err != nil {
			bad("disk: %v", err)
		}
		if c.DiskFormat != "raw" && c.DiskFormat != "qcow2" {
			bad("disk format %q: want raw or qcow2", c.DiskFormat)
		}
	}
	for _, p := range []string{c.OVMFCode, c.OVMFVars} {
		if p != "" {
			if err := safePath(p); err != nil {
				bad("ovmf: %v", err)
			}
		}
	}
	for _, n := range c.NICs {
		if !ifRE.MatchString(n.Tap) {
			bad("nic tap %q", n.Tap)
		}
		if hw, err := net.ParseMAC(n.MAC); err != nil || len(hw) != 6 {
			bad("nic mac %q", n.MAC)
		}
		if !nicOptsRE.MatchString(n.Options) {
			bad("nic options %q", n.Options)
		}
	}
	if c.Netns != "" && !nameRE.MatchString(c.Netns) {
		bad("netns %q", c.Netns)
	}
	if err := c.BootDevice.validate(); err != nil {
		bad("%v", err)
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, errors.Join(errs...))
	}
	return nil
}

func (d BootDevice) validate() error {
	switch d {
	case BootDisk, BootPXE, BootCD:
		return nil
	}
	return fmt.Errorf("boot device %q: want disk, pxe or cd", d)
}

// VM is the backend for one VM. Methods are safe for concurrent use within
// one process; across processes (ipmi_sim's chassis_control) the state
// files are the shared truth.
type VM struct {
	cfg Config
	log *slog.Logger
	mu  sync.Mutex
	// preStart runs before each qemu start (SetPreStart).
	preStart func(ctx context.Context) error
}

// SetPreStart makes f run before every qemu start of this VM, in this
// process; an error fails the start. It starts what the VM's devices
// connect to and that does not outlive a qemu process, as libvirt starts
// a VM's swtpm before each qemu start (qemu sends CMD_SHUTDOWN to swtpm
// when it exits, and swtpm ends).
func (v *VM) SetPreStart(f func(ctx context.Context) error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.preStart = f
}

// New validates cfg, creates cfg.Dir and writes cfg to Dir/vm.json (so
// Open in another process sees the same VM).
func New(cfg Config) (*VM, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.Dir, 0o750); err != nil {
		return nil, fmt.Errorf("vmpower: new %s: %w", cfg.Name, err)
	}
	b, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("vmpower: new %s: %w", cfg.Name, err)
	}
	if err := writeFileAtomic(filepath.Join(cfg.Dir, ConfigFile), append(b, '\n')); err != nil {
		return nil, fmt.Errorf("vmpower: new %s: %w", cfg.Name, err)
	}
	return newVM(cfg, cfg.Logger), nil
}

// Open loads the VM whose state directory is dir (written by New); logger
// may be nil.
func Open(dir string, logger *slog.Logger) (*VM, error) {
	b, err := os.ReadFile(filepath.Join(dir, ConfigFile))
	if err != nil {
		return nil, fmt.Errorf("vmpower: open %s: %w", dir, err)
	}
	var cfg Config
	if err := json.Unmarshal(b, &cfg); err != nil {
		return nil, fmt.Errorf("vmpower: open %s: %w", dir, err)
	}
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("vmpower: open %s: %w", dir, err)
	}
	return newVM(cfg, logger), nil
}

func newVM(cfg Config, logger *slog.Logger) *VM {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &VM{cfg: cfg, log: logger.With("vm", cfg.Name)}
}

// Config returns the VM's configuration with defaults applied.
func (v *VM) Config() Config { return v.cfg }

func (v *VM) path(name string) string { return filepath.Join(v.cfg.Dir, name) }

// Pid returns the pid of the running qemu, or 0 when the VM is off. A pid
// file whose process is gone, or now runs something other than a qemu of
// this directory, counts as off.
func (v *VM) Pid() int {
	b, err := os.ReadFile(v.path(PIDFile))
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 1 {
		return 0
	}
	cmdline, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
	if err != nil || !bytes.Contains(cmdline, []byte(v.path(PIDFile))) {
		return 0
	}
	// A zombie (exited, not yet reaped by its parent) is off too.
	stat, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err == nil {
		if i := bytes.LastIndexByte(stat, ')'); i > 0 && i+2 < len(stat) && stat[i+2] == 'Z' {
			return 0
		}
	}
	return pid
}

// PowerState returns the Redfish PowerState (Redfish ComputerSystem
// PowerState): "On" while the qemu process runs, "Off" otherwise.
func (v *VM) PowerState(ctx context.Context) (string, error) {
	if v.Pid() != 0 {
		return "On", nil
	}
	return "Off", nil
}

// BootDevice returns the stored boot device and whether it persists
// (false: it applies to the next start only, then reverts to BootDisk).
func (v *VM) BootDevice() (BootDevice, bool) {
	b, err := os.ReadFile(v.path(BootDevFile))
	if err != nil {
		return v.cfg.BootDevice, true
	}
	f := strings.Fields(string(b))
	if len(f) == 0 || BootDevice(f[0]).validate() != nil {
		return v.cfg.BootDevice, true
	}
	return BootDevice(f[0]), len(f) < 2 || f[1] != "once"
}

// EffectiveBootDevice is the device the next start boots first: BootPXE
// with Config.NetworkFirst, the stored BootDevice otherwise.
func (v *VM) EffectiveBootDevice() BootDevice {
	if v.cfg.NetworkFirst {
		return BootPXE
	}
	dev, _ := v.BootDevice()
	return dev
}

// SetBootDevice stores the boot device for the next power on, power cycle
// or ForceRestart (Redfish Boot.BootSourceOverrideTarget Pxe/Hdd/Cd with
// BootSourceOverrideEnabled Continuous (persistent) or Once; IPMI chassis
// bootdev). It does not touch a running VM.
func (v *VM) SetBootDevice(dev BootDevice, persistent bool) error {
	if err := dev.validate(); err != nil {
		return fmt.Errorf("vmpower: set boot device: %w", err)
	}
	s := string(dev)
	if !persistent {
		s += " once"
	}
	if err := writeFileAtomic(v.path(BootDevFile), []byte(s+"\n")); err != nil {
		return fmt.Errorf("vmpower: set boot device: %w", err)
	}
	v.log.Info("boot device set", "device", dev, "persistent", persistent)
	return nil
}

// startedBoot is the boot device the running process was started with, or
// "" if unknown.
func (v *VM) startedBoot() BootDevice {
	b, err := os.ReadFile(v.path(StartedBootFile))
	if err != nil {
		return ""
	}
	return BootDevice(strings.TrimSpace(string(b)))
}

// Media returns the image inserted as virtual media, or "".
func (v *VM) Media() string {
	b, err := os.ReadFile(v.path(MediaFile))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// InsertMedia inserts image (an absolute path, or an http:// or https://
// URL served with Range support) into the VM's CD-ROM, read-only (Redfish
// VirtualMedia.InsertMedia). A running VM gets it at once through QMP
// blockdev-change-medium; a VM that is off gets it at its next start.
func (v *VM) InsertMedia(ctx context.Context, image string) error {
	if err := validMedia(image); err != nil {
		return fmt.Errorf("vmpower: insert media: %w", err)
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if err := writeFileAtomic(v.path(MediaFile), []byte(image+"\n")); err != nil {
		return fmt.Errorf("vmpower: insert media: %w", err)
	}
	if v.Pid() != 0 {
		if err := v.withQMP(ctx, func(c *qmp.Client) error {
			return c.ChangeMedium(ctx, CDROMID, image, "raw", true)
		}); err != nil {
			return fmt.Errorf("vmpower: insert media: %w", err)
		}
	}
	v.log.Info("virtual media inserted", "image", image)
	return nil
}

// EjectMedia removes the virtual media (Redfish VirtualMedia.EjectMedia).
// It is a no-op when nothing is inserted.
func (v *VM) EjectMedia(ctx context.Context) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	if err := os.Remove(v.path(MediaFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("vmpower: eject media: %w", err)
	}
	if v.Pid() != 0 {
		if err := v.withQMP(ctx, func(c *qmp.Client) error { return c.Eject(ctx, CDROMID, true) }); err != nil {
			return fmt.Errorf("vmpower: eject media: %w", err)
		}
	}
	v.log.Info("virtual media ejected")
	return nil
}

func validMedia(image string) error {
	if strings.HasPrefix(image, "http://") || strings.HasPrefix(image, "https://") {
		if strings.ContainsAny(image, " \n\x00\"") {
			return fmt.Errorf("media url %q", image)
		}
		return nil
	}
	return safePath(image)
}

// QMP connects to the running VM's second monitor (MonitorSocket), for
// observing events or issuing commands alongside this package. qemu serves
// one client per monitor: a second QMP call waits until the first client
// closes. The caller closes the client.
func (v *VM) QMP(ctx context.Context) (*qmp.Client, error) {
	if v.Pid() == 0 {
		return nil, ErrPoweredOff
	}
	return qmp.Dial(ctx, v.path(MonitorSocket))
}

// Pause stops the guest's vCPUs (QMP stop): the machine hangs with its
// power on, as a host whose kernel or agent froze. Through the control
// socket, one short connection: the caller's monitor socket ([VM.QMP])
// may be held by a long-lived client (the VM lab's reset follower), and a
// QMP socket serves one client at a time.
func (v *VM) Pause(ctx context.Context) error {
	return v.withQMP(ctx, func(c *qmp.Client) error { return c.Stop(ctx) })
}

// Resume restarts the vCPUs after [VM.Pause] (QMP cont).
func (v *VM) Resume(ctx context.Context) error {
	return v.withQMP(ctx, func(c *qmp.Client) error { return c.Cont(ctx) })
}

func (v *VM) withQMP(ctx context.Context, f func(*qmp.Client) error) error {
	if v.Pid() == 0 {
		return ErrPoweredOff
	}
	c, err := qmp.Dial(ctx, v.path(QMPSocket))
	if err != nil {
		return err
	}
	defer c.Close()
	return f(c)
}

// Reset performs a Redfish ComputerSystem.Reset ResetType (Redfish
// ComputerSystem schema, ResetType enum). It implements the method of
// bmcsim.PowerBackend.
//
//   - On, ForceOn: start qemu; nil if already on.
//   - ForceOff: QMP quit, then kill by pid; nil if already off.
//   - GracefulShutdown: ACPI power button (system_powerdown); the guest
//     decides, and qemu exits when it powers off.
//   - GracefulRestart: power button, wait up to GracefulTimeout for the
//     guest to power off (then force it), start again.
//   - ForceRestart: system_reset, or a process restart when the boot
//     device or media changed since start.
//   - PowerCycle: power off, then on.
//   - PushPowerButton: power button when on, start when off.
//   - Nmi: QMP inject-nmi.
//
// Unknown types return ErrUnsupportedReset.
func (v *VM) Reset(ctx context.Context, resetType string) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.log.Info("reset", "type", resetType)
	var err error
	switch resetType {
	case "On", "ForceOn":
		err = v.start(ctx)
	case "ForceOff":
		err = v.stop(ctx)
	case "GracefulShutdown":
		err = v.powerButton(ctx)
	case "GracefulRestart":
		err = v.gracefulRestart(ctx)
	case "ForceRestart":
		if v.Pid() == 0 {
			err = ErrPoweredOff
			break
		}
		if v.EffectiveBootDevice() == v.startedBoot() {
			err = v.withQMP(ctx, func(c *qmp.Client) error { return c.SystemReset(ctx) })
			break
		}
		if err = v.stop(ctx); err == nil {
			err = v.start(ctx)
		}
	case "PowerCycle":
		if err = v.stop(ctx); err == nil {
			err = v.start(ctx)
		}
	case "PushPowerButton":
		if v.Pid() == 0 {
			err = v.start(ctx)
		} else {
			err = v.powerButton(ctx)
		}
	case "Nmi":
		err = v.withQMP(ctx, func(c *qmp.Client) error { return c.Execute(ctx, "inject-nmi", nil, nil) })
	default:
		return fmt.Errorf("%w: %q", ErrUnsupportedReset, resetType)
	}
	if err != nil {
		return fmt.Errorf("vmpower: reset %s %s: %w", v.cfg.Name, resetType, err)
	}
	return nil
}

func (v *VM) powerButton(ctx context.Context) error {
	if v.Pid() == 0 {
		return nil
	}
	return v.withQMP(ctx, func(c *qmp.Client) error { return c.SystemPowerdown(ctx) })
}

func (v *VM) gracefulRestart(ctx context.Context) error {
	pid := v.Pid()
	if pid == 0 {
		return v.start(ctx)
	}
	if err := v.powerButton(ctx); err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, v.cfg.GracefulTimeout)
	err := waitExit(wctx, pid)
	cancel()
	if err != nil {
		v.log.Warn("guest ignored the power button; forcing off", "err", err)
		if err := v.stop(ctx); err != nil {
			return err
		}
	}
	return v.start(ctx)
}

// Args returns the qemu command line (without the binary) the next start
// uses, given the stored boot device and media. Exposed for logs and tests.
func (v *VM) Args() []string {
	c := v.cfg
	dev := v.EffectiveBootDevice()
	args := []string{
		"-accel", c.Accel, "-m", strconv.Itoa(c.MemoryMiB), "-smp", strconv.Itoa(c.CPUs),
		"-nodefaults", "-no-user-config", "-display", "none", "-name", c.Name,
		"-chardev", "file,id=ser0,path=" + v.path(SerialLog) + ",append=on", "-serial", "chardev:ser0",
		"-qmp", "unix:" + v.path(QMPSocket) + ",server=on,wait=off",
		"-qmp", "unix:" + v.path(MonitorSocket) + ",server=on,wait=off",
		"-pidfile", v.path(PIDFile), "-daemonize",
		"-device", "virtio-rng-pci", // entropy for the guest's DHCP and TLS (LAB-NOTES §5.3)
	}
	if c.UUID != "" {
		args = append(args, "-uuid", c.UUID)
	}
	if c.Paused {
		args = append(args, "-S")
	}
	// bootindex: the chosen device first, then disk, cd, nic.
	order := []BootDevice{dev}
	for _, d := range []BootDevice{BootDisk, BootCD, BootPXE} {
		if d != dev {
			order = append(order, d)
		}
	}
	idx := map[BootDevice]int{}
	for i, d := range order {
		idx[d] = i + 1
	}
	switch c.Firmware {
	case UEFI:
		args = append(args, "-machine", "q35",
			"-drive", "if=pflash,format=raw,readonly=on,file="+v.ovmfCode(),
			"-drive", "if=pflash,format=raw,file="+v.path(VarsFile),
			"-drive", "if=none,id=cd0,media=cdrom,readonly=on"+v.mediaOpt(),
			"-device", "ide-cd,drive=cd0,id="+CDROMID+",bus=ide.2,bootindex="+strconv.Itoa(idx[BootCD]))
	case UEFIARM64:
		// No IDE on virt: the CD is a virtio-scsi disk, which AAVMF boots.
		args = append(args, "-machine", "virt", "-cpu", "max",
			"-drive", "if=pflash,format=raw,readonly=on,file="+v.ovmfCode(),
			"-drive", "if=pflash,format=raw,file="+v.path(VarsFile),
			"-device", "virtio-scsi-pci,id=scsi0",
			"-drive", "if=none,id=cd0,media=cdrom,readonly=on"+v.mediaOpt(),
			"-device", "scsi-cd,drive=cd0,id="+CDROMID+",bus=scsi0.0,bootindex="+strconv.Itoa(idx[BootCD]))
	default:
		args = append(args, "-machine", "pc,graphics=off",
			"-drive", "if=none,id=cd0,media=cdrom,readonly=on"+v.mediaOpt(),
			"-device", "ide-cd,drive=cd0,id="+CDROMID+",bus=ide.1,bootindex="+strconv.Itoa(idx[BootCD]))
	}
	if c.Disk != "" {
		args = append(args, "-drive", "file="+c.Disk+",format="+c.DiskFormat+",if=none,id=disk0,cache=unsafe",
			"-device", "virtio-blk-pci,drive=disk0,id=vdisk0,bootindex="+strconv.Itoa(idx[BootDisk]))
	}
	for i, n := range c.NICs {
		id := "n" + strconv.Itoa(i)
		dev := "virtio-net-pci,netdev=" + id + ",mac=" + n.MAC
		if n.Options != "" {
			dev += "," + strings.Trim(n.Options, ",")
		}
		if i == 0 {
			dev += ",bootindex=" + strconv.Itoa(idx[BootPXE])
		}
		args = append(args, "-netdev", "tap,id="+id+",ifname="+n.Tap+",script=no,downscript=no", "-device", dev)
	}
	return append(args, c.ExtraArgs...)
}

func (v *VM) mediaOpt() string {
	m := v.Media()
	if m == "" {
		return ""
	}
	return ",format=raw,file=" + m
}

func (v *VM) ovmfCode() string {
	switch {
	case v.cfg.OVMFCode != "":
		return v.cfg.OVMFCode
	case v.cfg.Firmware == UEFIARM64:
		return "/usr/share/AAVMF/AAVMF_CODE.fd" // Debian's qemu-efi-aarch64
	}
	return "/usr/share/OVMF/OVMF_CODE_4M.fd"
}

func (v *VM) ovmfVars() string {
	switch {
	case v.cfg.OVMFVars != "":
		return v.cfg.OVMFVars
	case v.cfg.Firmware == UEFIARM64:
		return "/usr/share/AAVMF/AAVMF_VARS.fd"
	}
	return "/usr/share/OVMF/OVMF_VARS_4M.fd"
}

// start launches qemu (daemonized) unless it already runs. A one-time boot
// device reverts to BootDisk once the process has started.
func (v *VM) start(ctx context.Context) error {
	if v.Pid() != 0 {
		return nil
	}
	if v.cfg.Firmware == UEFI || v.cfg.Firmware == UEFIARM64 {
		if _, err := os.Stat(v.path(VarsFile)); errors.Is(err, os.ErrNotExist) {
			b, err := os.ReadFile(v.ovmfVars())
			if err != nil {
				return fmt.Errorf("start: ovmf vars: %w", err)
			}
			if err := os.WriteFile(v.path(VarsFile), b, 0o640); err != nil {
				return fmt.Errorf("start: ovmf vars: %w", err)
			}
		}
	}
	if v.preStart != nil {
		if err := v.preStart(ctx); err != nil {
			return fmt.Errorf("start: %w", err)
		}
	}
	_ = os.Remove(v.path(PIDFile))
	_ = os.Remove(v.path(QMPSocket))
	_ = os.Remove(v.path(MonitorSocket))
	_, persistent := v.BootDevice()
	dev := v.EffectiveBootDevice()
	name, args := v.cfg.QEMU, v.Args()
	if v.cfg.Netns != "" {
		name, args = "ip", append([]string{"netns", "exec", v.cfg.Netns, v.cfg.QEMU}, args...)
	}
	cmd := exec.CommandContext(ctx, name, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	// qemu -daemonize returns once the VM is initialised (pid file written,
	// QMP socket listening); the daemon has no pipe to us once it detaches
	// (its stdio go to /dev/null).
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("start qemu: %w: %s", err, strings.TrimSpace(out.String()))
	}
	if v.Pid() == 0 {
		return fmt.Errorf("start qemu: no running process after start: %s", strings.TrimSpace(out.String()))
	}
	if err := writeFileAtomic(v.path(StartedBootFile), []byte(string(dev)+"\n")); err != nil {
		return fmt.Errorf("start: %w", err)
	}
	if !persistent {
		if err := v.SetBootDevice(BootDisk, true); err != nil {
			return err
		}
	}
	v.log.Info("powered on", "pid", v.Pid(), "boot", dev)
	return nil
}

// stop ends qemu: QMP quit, then SIGTERM and SIGKILL to the recorded pid
// (QuitTimeout each), waiting on a pidfd so a recycled pid is never hit.
func (v *VM) stop(ctx context.Context) error {
	pid := v.Pid()
	if pid == 0 {
		return nil
	}
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return nil // exited meanwhile
	}
	defer unix.Close(fd)
	if v.Pid() != pid { // the pid may have been recycled between Pid and PidfdOpen
		return nil
	}
	qctx, cancel := context.WithTimeout(ctx, v.cfg.QuitTimeout)
	if c, err := qmp.Dial(qctx, v.path(QMPSocket)); err == nil {
		_ = c.Quit(qctx)
		c.Close()
	}
	cancel()
	for _, sig := range []unix.Signal{0, unix.SIGTERM, unix.SIGKILL} {
		if sig != 0 {
			_ = unix.PidfdSendSignal(fd, sig, nil, 0)
		}
		if pidfdWait(fd, v.cfg.QuitTimeout) {
			_ = os.Remove(v.path(PIDFile))
			v.log.Info("powered off", "pid", pid)
			return nil
		}
	}
	return fmt.Errorf("stop qemu pid %d: still running after SIGKILL", pid)
}

// pidfdWait reports whether the process exited within d.
func pidfdWait(fd int, d time.Duration) bool {
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(fds, int(d/time.Millisecond))
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		return n > 0
	}
}

// waitExit waits for pid to exit or ctx to end.
func waitExit(ctx context.Context, pid int) error {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return nil
	}
	defer unix.Close(fd)
	for {
		if pidfdWait(fd, 200*time.Millisecond) {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
	}
}

// WaitOff waits until the VM is off (for example after the guest powered
// itself off) or ctx ends.
func (v *VM) WaitOff(ctx context.Context) error {
	pid := v.Pid()
	if pid == 0 {
		return nil
	}
	if err := waitExit(ctx, pid); err != nil {
		return fmt.Errorf("vmpower: wait off %s: %w", v.cfg.Name, err)
	}
	return nil
}

func writeFileAtomic(path string, b []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return err
	}
	if err := tmp.Close(); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// SetExtraArgs replaces Config.ExtraArgs (devices after the built-in ones:
// more disks, a TPM) and rewrites Dir/vm.json. A running qemu keeps its
// devices; the next start uses the new list, as a server whose drive was
// pulled while it was off. It is serialised with Reset.
func (v *VM) SetExtraArgs(args []string) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	cfg := v.cfg
	cfg.ExtraArgs = slices.Clone(args)
	b, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return fmt.Errorf("vmpower: set extra args of %s: %w", cfg.Name, err)
	}
	if err := writeFileAtomic(v.path(ConfigFile), append(b, '\n')); err != nil {
		return fmt.Errorf("vmpower: set extra args of %s: %w", cfg.Name, err)
	}
	v.cfg = cfg
	return nil
}
