package sim

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/ramdisk/agent"
)

// Phase is what a simulated machine is doing.
type Phase string

// Phases of a simulated machine.
const (
	PhaseOff           Phase = "off"
	PhaseFirmware      Phase = "firmware"      // powered on, PXE-booting
	PhaseCommissioning Phase = "commissioning" // ramdisk running the agent's commissioning
	PhaseDeploying     Phase = "deploying"     // ramdisk writing the image
	PhaseWiping        Phase = "wiping"        // ramdisk wiping a released server's disks
	PhaseInstalling    Phase = "installing"    // the distribution installer (autoinstall, kickstart) running
	PhaseOS            Phase = "os"            // booted the deployed OS from disk
	PhaseNoOS          Phase = "no-os"         // nothing bootable: firmware waits
)

// Machine is one simulated server behind a bmcsim BMC. It implements
// bmcsim.PowerBackend: power on runs firmware that network-boots first (as
// the VM lab's BIOS machines do with -boot order=nc), fetches the
// controller's real iPXE script for its MAC and follows it: the ramdisk's
// kernel line (with a real single-use token) runs the real agent code
// (ramdisk/agent.Runner) against a generated sysfs tree and sparse disk
// files; "exit"/"sanboot" boots the local disk, which counts as an OS when
// the deployed image is on it. A power-off the machine makes itself after
// a power-on through its BMC waits until the BMC has read it on, as the
// BMC of a real machine, on for minutes, always does (powerOffFrom).
type Machine struct {
	Name string
	MAC  string
	HW   Hardware

	root, devDir string
	// src is the machine's own loopback address, the source of its
	// joined OS's join and heartbeat connections (srcAddr).
	src netip.Addr
	lab *Lab
	log *slog.Logger

	mu            sync.Mutex
	on            bool
	phase         Phase
	gen           int // increments on every power change; a stale boot stops
	cancel        context.CancelFunc
	boots         int
	lastSeed      *v1.Seed
	installed     string   // the installer that wrote the disk, "" for none
	installerBoot []string // the installer kernel and initrd it booted
	joined        bool
	osCtx         context.Context    // the running OS's boot (ended by power off), nil before
	bootedAt      time.Time          // when the OS last booted from disk
	nodeCancel    context.CancelFunc // stops the node agent's heartbeats
	agentHTTP     *http.Client       // the ramdisk's client, keeping the deploy plan's seed
	powerFile     string             // IPMI machines: ipmi_sim's chassis_control power file
	serial        *serialPort        // IPMI machines: the serial line behind the BMC's SOL
	ttyLine       []byte             // the line being typed on the serial console (PhaseOS)
	// failMemory makes the commissioning memory test fail (fault injection).
	failMemory bool
	// corruptImages flips a byte of every image download in transit
	// (fault injection).
	corruptImages bool
	// imageRate bounds the image downloads' rate in bytes per second
	// (0: not bounded); with imageStalls, every image download stops
	// after imageStallAfter bytes until the request ends. Fault
	// injection: a slow disk or link, and one that stops moving.
	imageRate, imageStallAfter int64
	imageStalls                bool
	// stallTimeout is the ramdisk agent's Runner.StallTimeout (0: the
	// agent's default).
	stallTimeout time.Duration
	// sharePieces and badPieces: SharePieces, ServeBadPieces (pieces.go).
	sharePieces, badPieces bool
	// refuseKernel: RefuseKernel.
	refuseKernel bool
	// firmwareHTTP is the firmware's own HTTP client (script and kernel
	// requests), from the machine's address src, as each real machine's
	// firmware asks from its own address; built on first use.
	firmwareHTTP *http.Client
	// onAt is when the machine last powered on (or restarted) through its
	// BMC; unread is open from then until the BMC reads it on (closed by
	// bmcReadOn), nil when no such read is awaited. A power-off the
	// machine makes itself waits for it (powerOffFrom).
	onAt   time.Time
	unread chan struct{}
	// offHeld is set while such a power-off waits.
	offHeld bool
}

// RefuseKernel injects (or clears) a firmware that refuses the ramdisk's
// kernel after fetching it: UEFI Secure Boot with a kernel that is not
// signed by a key shim trusts. Debian 12's signed GRUB (grubnetx64 with
// shim 15.8, under OVMF with Secure Boot on) reads the whole kernel, asks
// shim to verify it, prints "error: bad shim signature." and, at the
// initrd line, "error: you need to load the kernel first.", and stops at
// its prompt with the machine on; real servers' firmware does the same
// with any image its db does not trust. The machine fetches the kernel
// the script names from the controller, writes GRUB's errors to its
// console, and waits there until it is reset or powered off; the ramdisk
// never runs. Cleared, its next boot runs the ramdisk as usual.
func (m *Machine) RefuseKernel(refuse bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.refuseKernel = refuse
}

// firmware returns the firmware's HTTP client, from the machine's address.
func (m *Machine) firmware() *http.Client {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.firmwareHTTP == nil {
		d := &net.Dialer{Timeout: 10 * time.Second, LocalAddr: &net.TCPAddr{IP: m.src.AsSlice()}}
		m.firmwareHTTP = &http.Client{Timeout: 5 * time.Minute, Transport: &http.Transport{DialContext: d.DialContext, DisableKeepAlives: true}}
	}
	return m.firmwareHTTP
}

// refusedKernel fetches the kernel the ramdisk script names, as a boot
// loader does before it verifies it, writes the Secure Boot refusal to
// the console, and waits with the machine on until the boot ends
// (RefuseKernel). It reports false when the machine boots normally.
func (m *Machine) refusedKernel(ctx context.Context, gen int, script string) bool {
	m.mu.Lock()
	refuse := m.refuseKernel
	m.mu.Unlock()
	if !refuse {
		return false
	}
	for _, line := range strings.Split(script, "\n") {
		if f := strings.Fields(line); len(f) >= 2 && (f[0] == "kernel" || f[0] == "linux") {
			if err := m.get(ctx, f[1]); err != nil {
				m.log.Warn("firmware: kernel fetch", "err", err)
			}
			break
		}
	}
	m.mu.Lock()
	if gen == m.gen {
		m.consoleOut("error: bad shim signature.\r\nerror: you need to load the kernel first.\r\n\r\nPress any key to continue...\r\n")
	}
	m.mu.Unlock()
	m.log.Info("firmware refused the kernel (Secure Boot): waiting at the boot loader")
	<-ctx.Done()
	return true
}

// get GETs u with the firmware's client and reads the whole answer.
func (m *Machine) get(ctx context.Context, u string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	resp, err := m.firmware().Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: HTTP %d", req.URL.Path, resp.StatusCode)
	}
	return nil
}

// ThrottleImages bounds the rate of the machine's image downloads to
// bytesPerSecond (0 lifts the bound): a long image write, as a 20-50 GiB
// image on a real disk or link is, in a lab whose images are 4 MiB.
func (m *Machine) ThrottleImages(bytesPerSecond int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.imageRate = bytesPerSecond
}

// StallImages makes every image download stop after the first after
// bytes and deliver nothing more until the request is given up (the
// machine reset, or its ramdisk's context ended): a write that stalls, as
// a dying disk or a wedged link does, while the ramdisk's progress
// reports go on. A negative after lifts it.
func (m *Machine) StallImages(after int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.imageStallAfter, m.imageStalls = after, after >= 0
}

func (m *Machine) agentStallTimeout() time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.stallTimeout
}

// SetStallTimeout sets the stall timeout of the machine's ramdisk agent
// (agent.Runner.StallTimeout: an image or piece response that delivers no
// bytes for this long is given up and asked again) for its next boots;
// zero is the agent's default, a minute.
func (m *Machine) SetStallTimeout(d time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.stallTimeout = d
}

// CorruptImages injects (or clears) a corrupting network path: every image
// the machine's ramdisk downloads from the controller (/images/...) arrives
// with one byte flipped, so its SHA-256 does not match the deploy plan's.
func (m *Machine) CorruptImages(corrupt bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.corruptImages = corrupt
}

// DiskPath returns the file backing the machine's disk name ("sda",
// "sdb", ...), to compare its bytes before and after a deploy.
func (m *Machine) DiskPath(name string) string { return filepath.Join(m.devDir, name) }

// client returns the HTTP client the ramdisk of the boot boot uses: the
// lab's, shaped or corrupting image downloads as set (ThrottleImages,
// StallImages, CorruptImages). It sends nothing once boot has ended: a
// machine that is reset or powered off takes its ramdisk with it, which
// then cannot post the outcome of the write the reset cut short (the
// agent posts its done without its context's cancellation, as it should
// when only its own deadline ended).
func (m *Machine) client(boot context.Context) *http.Client {
	m.mu.Lock()
	corrupt, rate, stall := m.corruptImages, m.imageRate, int64(-1)
	if m.imageStalls {
		stall = m.imageStallAfter
	}
	m.mu.Unlock()
	c := *m.agentHTTP
	base := c.Transport
	if base == nil {
		base = http.DefaultTransport
	}
	base = poweredTransport{base: base, boot: boot}
	if rate > 0 || stall >= 0 {
		base = shapedTransport{base: base, rate: rate, stallAfter: stall}
	}
	if corrupt {
		base = corruptTransport{base: base}
	}
	c.Transport = base
	return &c
}

// poweredTransport fails every request once the boot it belongs to ended
// (the machine was reset or powered off).
type poweredTransport struct {
	base http.RoundTripper
	boot context.Context
}

// RoundTrip answers 410 Gone without sending anything once the boot
// ended: a final answer the agent does not retry (a transport error would
// have it retry its done for a minute, logging to a test that is over),
// where a real machine's ramdisk would simply be gone.
func (t poweredTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if t.boot.Err() != nil {
		if r.Body != nil {
			r.Body.Close()
		}
		return &http.Response{StatusCode: http.StatusGone, Status: "410 Gone", Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1, Request: r,
			Header: http.Header{"Content-Type": {"application/json"}},
			Body:   io.NopCloser(strings.NewReader(`{"message":"sim: the machine was reset or powered off: its ramdisk is gone","code":"gone"}`))}, nil
	}
	return t.base.RoundTrip(r)
}

// shapedTransport slows (rate bytes per second) or stalls (after
// stallAfter bytes) every successful image download.
type shapedTransport struct {
	base             http.RoundTripper
	rate, stallAfter int64
}

func (t shapedTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := t.base.RoundTrip(r)
	if err != nil || resp.StatusCode/100 != 2 || !strings.HasPrefix(r.URL.Path, "/images/") {
		return resp, err
	}
	resp.Body = &shapedReader{rc: resp.Body, ctx: r.Context(), rate: t.rate, stallAfter: t.stallAfter}
	return resp, nil
}

// shapedReader delivers at most rate bytes a second, in reads of a tenth
// of that, and nothing after stallAfter bytes (>= 0) until ctx ends.
type shapedReader struct {
	rc               io.ReadCloser
	ctx              context.Context
	rate, stallAfter int64
	off              int64
}

func (s *shapedReader) Read(p []byte) (int, error) {
	if s.stallAfter >= 0 && s.off >= s.stallAfter {
		<-s.ctx.Done()
		return 0, s.ctx.Err()
	}
	if s.stallAfter >= 0 {
		p = p[:min(int64(len(p)), s.stallAfter-s.off)]
	}
	if s.rate > 0 {
		p = p[:min(int64(len(p)), max(s.rate/10, 1))]
		if !sleep(s.ctx, time.Duration(int64(len(p))*int64(time.Second)/s.rate)) {
			return 0, s.ctx.Err()
		}
	}
	n, err := s.rc.Read(p)
	s.off += int64(n)
	return n, err
}

func (s *shapedReader) Close() error { return s.rc.Close() }

// corruptTransport flips one byte of every successful image download.
type corruptTransport struct{ base http.RoundTripper }

func (t corruptTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := t.base.RoundTrip(r)
	if err != nil || resp.StatusCode != http.StatusOK || !strings.HasPrefix(r.URL.Path, "/images/") {
		return resp, err
	}
	resp.Body = &flipReader{rc: resp.Body, at: 4096}
	return resp, nil
}

// flipReader inverts the byte at offset at of the stream.
type flipReader struct {
	rc  io.ReadCloser
	off int64
	at  int64
}

func (f *flipReader) Read(p []byte) (int, error) {
	n, err := f.rc.Read(p)
	if f.at >= f.off && f.at < f.off+int64(n) {
		p[f.at-f.off] ^= 0xff
	}
	f.off += int64(n)
	return n, err
}

func (f *flipReader) Close() error { return f.rc.Close() }

// FailMemory injects (or clears) a failing DIMM: the commissioning memory
// test finds a flipped bit.
func (m *Machine) FailMemory(fail bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.failMemory = fail
}

func (m *Machine) failing() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.failMemory
}

// PowerState implements bmcsim.PowerBackend. A read that finds the
// machine on ends the wait of a power-off it makes itself
// (powerOffFrom).
func (m *Machine) PowerState(context.Context) (string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.on {
		m.bmcReadOnLocked()
		return "On", nil
	}
	return "Off", nil
}

// bmcReadOn records that the BMC read the machine's power, which it found
// on when the machine is on: a power-off the machine makes itself may
// then take effect. IPMI machines call it for each Get Chassis Status
// ipmi_sim answered (followChassis).
func (m *Machine) bmcReadOn() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.on {
		m.bmcReadOnLocked()
	}
}

func (m *Machine) bmcReadOnLocked() {
	if m.unread != nil {
		close(m.unread)
		m.unread = nil
	}
}

// Reset implements bmcsim.PowerBackend with the ResetTypes bmcsim already
// checked against the tree's allowed values.
func (m *Machine) Reset(_ context.Context, resetType string) error {
	switch resetType {
	case "On", "ForceOn":
		m.power(true, false, true)
	case "ForceOff", "GracefulShutdown":
		m.power(false, false, true)
	case "ForceRestart", "GracefulRestart", "PowerCycle":
		m.power(true, true, true)
	case "PushPowerButton":
		m.mu.Lock()
		on := m.on
		m.mu.Unlock()
		m.power(!on, false, true)
	case "Nmi":
	default:
		return fmt.Errorf("sim: unknown ResetType %q", resetType)
	}
	return nil
}

// power switches the machine; restart forces a new boot even when on.
// viaBMC says the BMC did it (a Reset, a Chassis Control): then the BMC's
// power wait is to read it on before the machine may power itself off.
func (m *Machine) power(on, restart, viaBMC bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.on == on && !restart {
		return
	}
	if m.cancel != nil {
		m.cancel()
		m.cancel = nil
	}
	m.gen++
	m.on = on
	m.bmcReadOnLocked() // no earlier power-on waits any more
	if !on {
		m.phase = PhaseOff
		return
	}
	if viaBMC {
		m.onAt, m.unread = time.Now(), make(chan struct{})
	}
	ctx, cancel := context.WithCancel(m.lab.ctx)
	m.cancel = cancel
	gen := m.gen
	m.phase = PhaseFirmware
	m.lab.goRun(func() { m.run(ctx, gen) })
}

// PowerOn presses the power button of a machine that is off, as a person
// in the data centre does: the firmware network-boots at once. It does
// nothing to a machine that is on.
func (m *Machine) PowerOn() { m.power(true, false, false) }

// Phase returns what the machine is doing now.
// Seed returns a copy of the NoCloud seed of the machine's last deploy
// plan (or installer document), nil before one.
func (m *Machine) Seed() *v1.Seed {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.lastSeed == nil {
		return nil
	}
	s := *m.lastSeed
	return &s
}

func (m *Machine) Phase() Phase {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.phase
}

// Boots counts power-ons and reboots.
func (m *Machine) Boots() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.boots
}

func (m *Machine) setPhase(gen int, p Phase) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if gen != m.gen {
		return false
	}
	m.phase = p
	switch p {
	case PhaseCommissioning:
		m.consoleOut("machina ramdisk: commissioning\r\n")
	case PhaseDeploying:
		m.consoleOut("machina ramdisk: deploying\r\n")
	case PhaseNoOS:
		m.consoleOut("No bootable device.\r\n")
	case PhaseOS:
		m.ttyLine = m.ttyLine[:0]
		m.consoleOut(m.osBanner())
	}
	return true
}

// run is the firmware and what it boots, until the machine powers off or
// the boot's context ends.
func (m *Machine) run(ctx context.Context, gen int) {
	for {
		m.mu.Lock()
		m.boots++
		if gen == m.gen {
			m.consoleOut("\r\nMachina simulated firmware: network boot from " + m.MAC + "\r\n")
		}
		m.mu.Unlock()
		if !sleep(ctx, m.lab.cfg.BootDelay) {
			return
		}
		script, err := m.fetchScript(ctx)
		if err != nil {
			if ctx.Err() == nil {
				m.log.Warn("PXE: no script; retrying", "err", err)
				if !sleep(ctx, time.Second) {
					return
				}
				continue
			}
			return
		}
		if ib, ok := parseInstallerScript(script); ok {
			m.setPhase(gen, PhaseInstalling)
			if err := m.install(ctx, ib); err != nil {
				m.log.Warn("installer failed", "err", err)
				// A failed installer stops at its error screen with the
				// machine on (anaconda and subiquity wait for a person):
				// the deploy deadline fails the server and powers it off
				// through the BMC. It powered itself off here before, at
				// once, which no real installer does: a controller whose
				// power-on check polled after that saw "off" and waited
				// out its action timeout (TestInstallerDeadline, 1 run of
				// lab/sim's whole package in this session).
				<-ctx.Done()
				return
			}
			continue // the installer reboots: firmware again
		}
		args, isRamdisk := kernelArgs(script)
		if !isRamdisk {
			m.bootDisk(ctx, gen)
			return
		}
		if m.refusedKernel(ctx, gen, script) {
			return
		}
		mode := args["machina.mode"]
		client := &v1.AgentClient{BaseURL: args["machina.url"], HTTP: m.client(ctx)}
		r := &agent.Runner{Client: client, Token: args["machina.token"], BootMAC: m.MAC, Root: m.root, DevDir: m.devDir,
			Tests:       agent.CommissionConfig{MemoryTestBytes: 64 << 10, DiskReadBytes: 64 << 10, NetworkTestBytes: 256 << 10},
			MemoryLimit: 64 << 20, Version: "sim", Logger: m.log, StallTimeout: m.agentStallTimeout()}
		switch mode {
		case "commission":
			m.setPhase(gen, PhaseCommissioning)
			if m.failing() {
				r.Tests.MemoryFault = func(words []uint64) { words[len(words)/2] ^= 1 << 7 } // a stuck bit
			}
			ack, err := r.Commission(ctx)
			if err != nil {
				m.log.Warn("commissioning failed", "err", err)
			} else {
				m.log.Info("commissioned", "lifecycle", ack.Lifecycle, "reason", ack.Reason)
			}
			// The agent powers off after commissioning.
			m.powerOffFrom(ctx, gen)
			return
		case "deploy":
			m.setPhase(gen, PhaseDeploying)
			stopPieces := m.withPieces(r)
			res, err := r.Deploy(ctx)
			stopPieces()
			if err != nil {
				m.log.Warn("deploy failed", "err", err)
				if !sleep(ctx, 100*time.Millisecond) {
					return
				}
				m.powerOffFrom(ctx, gen) // the ramdisk halts; the controller decides
				return
			}
			m.log.Info("deployed", "disk", res.DiskName, "bytes", res.BytesWritten)
			// The agent reboots after a deploy: firmware again.
			continue
		case "wipe":
			m.setPhase(gen, PhaseWiping)
			res, err := r.Wipe(ctx)
			if err != nil {
				m.log.Warn("release wipe failed", "err", err)
			} else {
				m.log.Info("release wipe done", "disks", res.Disks)
			}
			// The agent powers off after the wipe, good or bad.
			m.powerOffFrom(ctx, gen)
			return
		default:
			m.log.Warn("unknown ramdisk mode", "mode", mode)
			return
		}
	}
}

// DefaultPowerOffHold is Config.PowerOffHold's default: several Redfish
// poll intervals (2 s in bmc/redfish, 500 ms in bmc/ipmi).
const DefaultPowerOffHold = 10 * time.Second

// powerOffFrom powers the machine off, as its agent does after
// commissioning, a wipe or a failed deploy, unless the power changed
// since boot gen began.
//
// A real machine is on for minutes after a power-on: its firmware's POST
// alone takes tens of seconds (more with many DIMMs or option ROMs) before
// it network-boots, so the BMC's power wait after an On always reads it
// on. The simulated machine boots in no time (zero BootDelay in the tests
// and bench/scale) and its agent can report and power it off within
// milliseconds of the On, before the BMC's first read: the wait then read
// off until its power timeout (5 minutes for Redfish on BMCs without
// LastResetTime or BootProgress, as HPE iLO 5 and Lenovo XCC; 60 s for
// IPMI, which has neither) although the power-on had happened. So after a
// power-on through the BMC, the machine's own power-off waits until the
// BMC has read it on once (PowerState, or a Get Chassis Status ipmi_sim
// answered), at most Config.PowerOffHold after the power-on. Reports and
// reboots are not delayed: when the BMC read it on at once, as it does
// but under load, the power-off is as quick as before.
func (m *Machine) powerOffFrom(ctx context.Context, gen int) {
	m.mu.Lock()
	unread := m.unread
	var hold time.Duration
	if unread != nil && gen == m.gen {
		hold = time.Until(m.onAt.Add(m.lab.powerOffHold()))
	}
	m.offHeld = hold > 0
	m.mu.Unlock()
	if hold > 0 {
		t := time.NewTimer(hold)
		select {
		case <-unread:
		case <-t.C:
			m.log.Info("powering off although the BMC has not read the machine on since its power-on", "held", m.lab.powerOffHold())
		case <-ctx.Done():
		}
		t.Stop()
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.offHeld = false
	if gen == m.gen {
		m.consoleOut("reboot: Power down\r\n")
		m.on, m.phase = false, PhaseOff
		m.gen++
		m.syncPowerFile(false)
	}
}

// fetchScript GETs the iPXE script for the machine's MAC, as iPXE does
// after the chain script; an arm64 machine GETs the GRUB script, as the
// arm64 GRUB image's machina-grub.cfg does.
func (m *Machine) fetchScript(ctx context.Context) (string, error) {
	u := strings.TrimRight(m.lab.controllerURL(), "/") + "/boot/ipxe?mac=" + url.QueryEscape(m.MAC) + "&platform=efi&arch=x86_64"
	if m.HW.Arch == "arm64" {
		u = strings.TrimRight(m.lab.controllerURL(), "/") + "/boot/grub?mac=" + url.QueryEscape(m.MAC) + "&platform=efi&arch=arm64"
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return "", err
	}
	resp, err := m.firmware().Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET %s: HTTP %d: %s", req.URL.Path, resp.StatusCode, bytes.TrimSpace(b))
	}
	return string(b), nil
}

// kernelArgs finds the ramdisk kernel line of an iPXE script (`kernel`)
// or a GRUB script (`linux`) and returns its key=value arguments.
func kernelArgs(script string) (map[string]string, bool) {
	for _, line := range strings.Split(script, "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || f[0] != "kernel" && f[0] != "linux" {
			continue
		}
		args := map[string]string{}
		for _, a := range f[2:] {
			if k, v, ok := strings.Cut(a, "="); ok {
				args[k] = v
			}
		}
		return args, args["machina.token"] != ""
	}
	return nil, false
}

// bootDisk boots the first disk: an OS when it holds the deployed image
// and its NoCloud seed; otherwise the firmware finds nothing to boot.
func (m *Machine) bootDisk(ctx context.Context, gen int) {
	f, err := os.Open(filepath.Join(m.devDir, "sda"))
	if err != nil {
		m.setPhase(gen, PhaseNoOS)
		return
	}
	head := make([]byte, len(osMarker))
	_, err = f.ReadAt(head, 0)
	f.Close()
	if err != nil || !bytes.Equal(head, []byte(osMarker)) {
		m.log.Info("no bootable OS on disk")
		m.setPhase(gen, PhaseNoOS)
		return
	}
	m.setPhase(gen, PhaseOS)
	m.log.Info("booted the deployed OS from disk")
	if err := m.firstBoot(ctx); err != nil && ctx.Err() == nil {
		m.log.Warn("first boot: join failed", "err", err)
	}
}

// osMarker starts the simulated OS image, so a disk boot can tell a
// deployed disk from an empty one.
const osMarker = "MACHINA-SIM-OS-IMAGE\n"

func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
