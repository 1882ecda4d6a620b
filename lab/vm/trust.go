package vm

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/attestation"
	"github.com/machina-metal/machina/boot"
	"github.com/machina-metal/machina/gitops"
	"github.com/machina-metal/machina/lab/vm/osimage"
	"github.com/machina-metal/machina/lab/vm/vmpower"
)

// TrustBudget is the time the Secure Boot lab (Config.Trust) must stay
// under on a 2-core machine under TCG, the cached OS image excepted.
// Measured with a load average of 10-17 when the lab OS image was 1 GiB
// and vm-trust verified it in two passes: 13.4 minutes from setup to
// vm-trust deployed (commission 127 s, the spoofer 169 s, the deploy
// 482 s); the first boot and join add about four. With the 512 MiB image
// and vm-trust's memory at WaveMemoryMiB plus 256 MiB (enough for the
// agent's one-pass limit, a quarter of MemTotal) the whole lab took
// 494.7 s in .ci/run on the same machine.
const TrustBudget = 25 * time.Minute

// The Secure Boot lab's server and profile: vm-trust boots OVMF with
// Secure Boot on and Microsoft's keys enrolled (Debian's
// OVMF_CODE_4M.ms.fd and OVMF_VARS_4M.ms.fd, the vars copied per VM) and
// a swtpm TPM 2.0; its pinned profile sets firmware.secureBoot: true and
// attestation: required.
const (
	TrustMachine = "vm-trust"
	TrustProfile = "lab-trust"
)

// OVMF with Secure Boot (SMM build) and Microsoft's KEK and db (UEFI CA
// 2011, which signed Debian's shim) enrolled: Debian's ovmf package.
const (
	ovmfSecureCode = "/usr/share/OVMF/OVMF_CODE_4M.ms.fd"
	ovmfSecureVars = "/usr/share/OVMF/OVMF_VARS_4M.ms.fd"
)

// trustProfileYAML is the Secure Boot profile's profiles.yaml entry ("" outside
// the Secure Boot lab): count 0, the lab pins it.
func (l *lab) trustProfileYAML() string {
	if !l.cfg.Trust {
		return ""
	}
	return `  - name: ` + TrustProfile + `
    image: ` + ImageName + `
    deploy: image
    attestation: required
    firmware:
      secureBoot: true
    sshKeys:
      - "` + l.sshPub + `"
    zone: lab
    min: {cores: 1, memoryGiB: 1, diskGiB: 2}
    count: 0
    join:
      site: vmtrust
      tags: [vm, secureboot]
      networks:
        - {name: lab, bridge: br-lab, nic: ` + GuestNIC + `, cidr: ` + Subnet + `}
`
}

// trustTPMSetup manufactures vm-trust's (and the spoofer's) TPM the way a
// TPM vendor does, as libvirt does for its TPMs: an EK, its certificate
// and a platform certificate, NVRAM locked.
var trustTPMSetup = []string{"--create-ek-cert", "--create-platform-cert", "--lock-nvram", "--overwrite", "--display"}

// secureBootQEMUArgs run OVMF's Secure Boot (SMM) build: SMM on and its
// flash writable only from SMM, so the OS cannot rewrite the key stores.
var secureBootQEMUArgs = []string{"-machine", "smm=on", "-global", "driver=cfi.pflash01,property=secure,value=on"}

// trustTune makes m a Secure Boot machine with a TPM: OVMF with Microsoft's
// keys (the vars copied per VM by vmpower), a TIS TPM on its own swtpm,
// started before each qemu start.
func (l *lab) trustTune(m *machine, vcfg *vmpower.Config) error {
	vcfg.OVMFCode, vcfg.OVMFVars = ovmfSecureCode, ovmfSecureVars
	t, err := newSWTPM(filepath.Join(vcfg.Dir, "tpm"), trustTPMSetup...)
	if err != nil {
		return fmt.Errorf("vm lab: %s: %w", m.name, err)
	}
	m.tpm = t
	vcfg.ExtraArgs = append(slices.Clone(secureBootQEMUArgs), t.qemuArgs("tpm-tis")...)
	m.preStart = func(context.Context) error { return t.ensure() }
	return nil
}

// runTrust is the Secure Boot lab: vm-trust network-boots with Secure
// Boot on through the signed chain the controller serves (OVMF PXE →
// DHCP → shimx64.efi → grubx64.efi → grub/grub.cfg → machina/grub/MAC →
// the signed kernel and the ramdisk, all by TFTP), runs locked down, attests
// with its swtpm against the boot chain the controller computed from the
// served files (required by the profile), and commissions to ready; its
// EK is enrolled (state and status commit).
func (l *lab) runTrust(ctx context.Context) error {
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
	l.step("setup: netns, Redfish BMC, swtpm, repository, controller with --secureboot-shim/--secureboot-grub", t0)
	m := l.ms[0]

	t0 = time.Now()
	if err := l.waitServers(ctx, TrustMachine+" commissions to ready", l.scale(11*time.Minute), func(ss []v1.Server) error {
		return l.lifecycles(ss, map[string]string{TrustMachine: "ready"}, true)
	}); err != nil {
		return err
	}
	if err := l.secureBooted(m); err != nil {
		return err
	}
	l.step("commission: "+TrustMachine+" (OVMF Secure Boot PXE → shimx64.efi → grubx64.efi → grub/grub.cfg → TFTP machina/grub/MAC → signed kernel, locked down) ready", t0)

	t0 = time.Now()
	if err := l.waitStatus(ctx, gitops.ServerStatusPath(TrustMachine), `ek: "sha256:`); err != nil {
		return err
	}
	if err := l.attestedChain(); err != nil {
		return err
	}
	l.step("attestation: "+TrustMachine+"'s EK enrolled (status commit); its quote and event log verified against the chain computed from the served shim, GRUB, kernel and initrd", t0)
	return l.runTrustSpoof(ctx)
}

// runTrustSpoof is the Secure Boot lab after commissioning: vm-trust's EK
// pinned in Git, the spoofer refused its plan (spoofPlan), vm-trust's own
// deploy with quotes and its first boot under Secure Boot to the join
// (deployTrust, trustHostChecks), then the spoofer's replays at plan, done
// and join refused (spoofReplay); last, vm-trust's release under a
// controller serving an unsigned kernel (runUnsignedKernel).
func (l *lab) runTrustSpoof(ctx context.Context) error {
	t0 := time.Now()
	ek, err := l.pinEK(ctx)
	if err != nil {
		return err
	}
	l.step("pin: "+TrustMachine+"'s EK "+ek+" committed to servers.yaml tpm.ek", t0)

	t0 = time.Now()
	attested, err := l.verifiedAttestations()
	if err != nil {
		return err
	}
	if err := l.spoofPlan(ctx, ek); err != nil {
		return err
	}
	l.step("spoofer: "+SpoofMachine+" (own swtpm, "+TrustMachine+"'s MAC and address, "+TrustMachine+" cut off) refused the plan: its attestation (EK not the pinned one; status TPMAttested=False EKMismatch) and its plan request without one (attestation_required); no plan served", t0)

	t0 = time.Now()
	if err := l.deployTrust(ctx, attested); err != nil {
		return err
	}
	l.step("deploy: "+TrustMachine+" deployed the lab OS image (profile count 1) with verified quotes before its plan and its done", t0)

	t0 = time.Now()
	ip, err := l.trustHostChecks(ctx)
	if err != nil {
		return err
	}
	l.step("first boot: "+TrustMachine+"'s deployed OS booted with Secure Boot on (SecureBoot variable 1, kernel: Secure boot enabled), joined and heartbeats", t0)

	t0 = time.Now()
	as, err := l.spoofReplay(ctx, ip)
	if err != nil {
		return err
	}
	var ans []string
	for _, a := range as {
		ans = append(ans, fmt.Sprintf("%s → %d", a.what, a.status))
	}
	l.step("spoofer replays from "+TrustMachine+"'s address ("+TrustMachine+" off), all refused, its records unchanged: "+strings.Join(ans, "; "), t0)
	return l.runUnsignedKernel(ctx)
}

// secureBooted checks m's serial console: the firmware's PXE got shim,
// shim fetched GRUB, GRUB ran Machina's x86_64 script, and the kernel
// says Secure Boot is on and it is locked down.
func (l *lab) secureBooted(m *machine) error {
	serial := filepath.Join(m.vm.Config().Dir, vmpower.SerialLog)
	b, err := os.ReadFile(serial)
	if err != nil {
		return fmt.Errorf("vm lab: %s serial log: %w", m.name, err)
	}
	for _, want := range []string{
		"NBP filename is " + boot.ShimImageX64,
		"Fetching Netboot Image " + boot.GRUBImageX64,
		// GRUB's echo of the per-machine script, which GRUB wraps at 80
		// columns (the start only).
		"Machina: fetching (tftp," + BridgeAddr + ")/" + boot.GRUBTFTPScriptDir + m.mac,
		"Machina: " + m.mac + " (" + m.name + ") lifecycle=commissioning platform=efi",
		"EFI stub: UEFI Secure Boot is enabled.",
		"Kernel is locked down from EFI Secure Boot",
		"secureboot: Secure boot enabled",
	} {
		if !strings.Contains(string(b), want) {
			return fmt.Errorf("vm lab: %s: the serial log lacks %q (see %s)", m.name, want, serial)
		}
	}
	// qemu's virtio-net option ROM holds an unsigned iPXE driver, and
	// Debian's OVMF runs option ROMs without verifying them (real Secure
	// Boot firmware refuses an unsigned one): it asks DHCP as iPXE first.
	// The controller gives it nothing ("Nothing to boot"), and it never
	// fetches a script; the firmware's own PXE then gets shim.
	if strings.Contains(string(b), "iPXE") && !strings.Contains(string(b), "Nothing to boot") {
		return fmt.Errorf("vm lab: %s: iPXE ran and was not refused (see %s)", m.name, serial)
	}
	if strings.Contains(string(b), "/boot/ipxe") || strings.Contains(string(b), "snponly.efi") {
		return fmt.Errorf("vm lab: %s: a Secure Boot server was offered iPXE (see %s)", m.name, serial)
	}
	return nil
}

// attestedChain checks the controller's log: the attestation of vm-trust
// verified, and the boot applications it matched are the Authenticode
// digests of the served shim, GRUB and kernel, computed here from the
// same files.
func (l *lab) attestedChain() error {
	b, err := os.ReadFile(filepath.Join(l.dir, "controller.log"))
	if err != nil {
		return fmt.Errorf("vm lab: %w", err)
	}
	var line string
	for _, ln := range strings.Split(string(b), "\n") {
		if strings.Contains(ln, "attestation verified") && strings.Contains(ln, TrustMachine) {
			line = ln
		}
	}
	if line == "" {
		return errors.New("vm lab: the controller log has no verified attestation of " + TrustMachine)
	}
	for _, p := range []string{boot.DefaultShimPath, boot.DefaultGRUBX64Path, filepath.Join(l.cfg.Root, "out", "ramdisk", "vmlinuz")} {
		img, err := os.ReadFile(p)
		if err != nil {
			return fmt.Errorf("vm lab: %w", err)
		}
		d, err := attestation.Authenticode(img)
		if err != nil {
			return fmt.Errorf("vm lab: %s: %w", p, err)
		}
		if !strings.Contains(line, hex.EncodeToString(d)) {
			return fmt.Errorf("vm lab: %s's verified attestation lacks %s's Authenticode digest %x: %s", TrustMachine, p, d, line)
		}
	}
	l.log.Info("attestation verified with the computed chain", "line", line)
	return nil
}

// SpoofMachine is the Secure Boot lab's spoofing VM: its own swtpm (so its
// own EK), OVMF with Secure Boot, and vm-trust's boot MAC, so DHCP hands
// it vm-trust's address and the boot script for vm-trust.
const SpoofMachine = "vm-spoof"

// spoofer is the spoofing VM and what the lab captured as the attacker.
type spoofer struct {
	vm  *vmpower.VM
	tpm *swtpm
	tap string
	sn  *sniffer
	// ip is the address the spoofer got for vm-trust's MAC; planToken the
	// token its boot script carried (both read off the wire).
	ip        netip.Addr
	planToken string
	// local is an address added to the bridge to send from the spoofer's
	// position ("" when none).
	local string
}

// trustTap is vm-trust's tap (its cable on the lab switch).
func (l *lab) trustTap() (*machine, string, error) {
	for i, m := range l.ms {
		if m.name == TrustMachine {
			return m, l.ns.Taps[i], nil
		}
	}
	return nil, "", errors.New("vm lab: no " + TrustMachine)
}

// ipNS runs `ip -n NS args...`.
func (l *lab) ipNS(ctx context.Context, args ...string) error {
	out, err := exec.CommandContext(ctx, "ip", append([]string{"-n", l.ns.Name}, args...)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("vm lab: ip %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

// pinEK commits vm-trust's enrolled EK to servers.yaml (tpm.ek), as an
// operator merges the controller's proposal after checking it against the
// TPM vendor's record; from then on another EK is refused.
func (l *lab) pinEK(ctx context.Context) (string, error) {
	body, _ := readHead(l.bare, gitops.ServerStatusPath(TrustMachine))
	m := regexp.MustCompile(`ek: "?(sha256:[0-9a-f]{64})`).FindStringSubmatch(body)
	if m == nil {
		return "", fmt.Errorf("vm lab: %s's status has no enrolled EK:\n%s", TrustMachine, body)
	}
	ek := m[1]
	pin := "    profile: " + TrustProfile + "\n"
	if err := l.push(ctx, "servers.yaml: pin "+TrustMachine+"'s TPM EK", func() error {
		return replaceFile(filepath.Join(l.clone, "servers.yaml"), pin, pin+"    tpm: {ek: \""+ek+"\"}\n")
	}); err != nil {
		return "", err
	}
	return ek, nil
}

// events returns the controller's events about server after seq.
func (l *lab) events(ctx context.Context, server string, after uint64) ([]v1.Event, error) {
	var out []v1.Event
	for {
		c, cancel := context.WithTimeout(ctx, 20*time.Second)
		list, err := l.api.Events(c, after, 500)
		cancel()
		if err != nil {
			return nil, err
		}
		for _, e := range list.Events {
			if e.Server == server {
				out = append(out, e)
			}
			after = max(after, e.Seq)
		}
		if list.Next == 0 || len(list.Events) == 0 {
			return out, nil
		}
		after = list.Next
	}
}

// lastEventSeq is the newest event's sequence number.
func (l *lab) lastEventSeq(ctx context.Context) uint64 {
	var last uint64
	for {
		c, cancel := context.WithTimeout(ctx, 20*time.Second)
		list, err := l.api.Events(c, last, 500)
		cancel()
		if err != nil || len(list.Events) == 0 {
			return last
		}
		for _, e := range list.Events {
			last = max(last, e.Seq)
		}
	}
}

// waitEvent polls vm-trust's events after seq until one has kind and a
// message containing text.
func (l *lab) waitEvent(ctx context.Context, after uint64, kind, text string, d time.Duration) (v1.Event, error) {
	deadline := time.Now().Add(d)
	for {
		es, err := l.events(ctx, TrustMachine, after)
		if err == nil {
			for _, e := range es {
				if e.Kind == kind && strings.Contains(e.Message, text) {
					return e, nil
				}
			}
		}
		if time.Now().After(deadline) {
			return v1.Event{}, fmt.Errorf("vm lab: no %s event for %s with %q within %s (last error %v)", kind, TrustMachine, text, d, err)
		}
		select {
		case <-ctx.Done():
			return v1.Event{}, ctx.Err()
		case <-time.After(2 * time.Second):
		}
	}
}

// startSpoofer pulls vm-trust's cable (its tap leaves the bridge: the
// real machine is cut off, as when it is off or unplugged) and boots the
// spoofer on a tap of its own with vm-trust's MAC, network first.
func (l *lab) startSpoofer(ctx context.Context) error {
	m, tap, err := l.trustTap()
	if err != nil {
		return err
	}
	sp := &spoofer{tap: "spoof0"}
	l.spoof = sp
	if sp.sn, err = sniff(l.ns.Name, l.ns.Bridge, netip.MustParseAddr(BridgeAddr)); err != nil {
		return err
	}
	if err := l.ipNS(ctx, "link", "set", tap, "nomaster"); err != nil {
		return err
	}
	for _, a := range [][]string{{"tuntap", "add", "dev", sp.tap, "mode", "tap"}, {"link", "set", sp.tap, "master", l.ns.Bridge}, {"link", "set", sp.tap, "up"}} {
		if err := l.ipNS(ctx, a...); err != nil {
			return err
		}
	}
	dir := filepath.Join(l.dir, "vms", SpoofMachine)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	disk := filepath.Join(dir, "disk.raw")
	if err := os.WriteFile(disk, nil, 0o644); err != nil {
		return err
	}
	if err := os.Truncate(disk, 4<<30); err != nil {
		return err
	}
	if sp.tpm, err = newSWTPM(filepath.Join(dir, "tpm"), trustTPMSetup...); err != nil {
		return fmt.Errorf("vm lab: %s: %w", SpoofMachine, err)
	}
	sp.vm, err = vmpower.New(vmpower.Config{Name: SpoofMachine, Dir: dir, Firmware: vmpower.UEFI, OVMFCode: ovmfSecureCode, OVMFVars: ovmfSecureVars,
		MemoryMiB: 1536, CPUs: 1, UUID: "6a1f0e3c-1414-4222-8333-0000000000ee", Disk: disk, Netns: l.ns.Name,
		NICs: []vmpower.NIC{{Tap: sp.tap, MAC: m.mac}}, BootDevice: vmpower.BootPXE,
		ExtraArgs: append(slices.Clone(secureBootQEMUArgs), sp.tpm.qemuArgs("tpm-tis")...), Logger: l.log.With("vm", SpoofMachine)})
	if err != nil {
		return fmt.Errorf("vm lab: %s: %w", SpoofMachine, err)
	}
	sp.vm.SetPreStart(func(context.Context) error { return sp.tpm.ensure() })
	return sp.vm.Reset(ctx, "On")
}

// closeSpoofer ends what startSpoofer started (the namespace's deletion
// removes the tap and any added address).
func (l *lab) closeSpoofer() {
	sp := l.spoof
	if sp == nil {
		return
	}
	if sp.vm != nil {
		_ = sp.vm.Reset(context.Background(), "ForceOff")
	}
	sp.tpm.stop()
	sp.sn.close()
}

// attackerClient is an HTTP client whose connections come from src inside
// the namespace (the spoofer's position), verifying no certificate (an
// attacker does not care whose TLS it reaches).
func (l *lab) attackerClient(src netip.Addr) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: src.AsSlice()}, Timeout: 10 * time.Second}
	tr := &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			var c net.Conn
			err := inNetns(l.ns.Name, func() (err error) {
				c, err = d.DialContext(ctx, network, addr)
				return err
			})
			return c, err
		},
		TLSClientConfig:   &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // the attacker's client
		DisableKeepAlives: true,
	}
	return &http.Client{Transport: tr, Timeout: 20 * time.Second}
}

// attempt is one request the attacker sent and the controller's answer.
type attempt struct {
	what   string
	status int
	body   string
}

// attack sends method url with token as bearer (or in body for the join)
// from the spoofer's position and returns the answer.
func (l *lab) attack(ctx context.Context, c *http.Client, what, method, url, token string, body any) (attempt, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return attempt{}, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return attempt{}, err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.Do(req)
	if err != nil {
		return attempt{}, fmt.Errorf("vm lab: %s: %w", what, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	a := attempt{what: what, status: resp.StatusCode, body: strings.TrimSpace(string(b))}
	l.log.Info("spoofer request answered", "what", what, "status", a.status, "body", a.body)
	if a.status < 400 {
		return a, fmt.Errorf("vm lab: %s was honoured: %d %s", what, a.status, a.body)
	}
	return a, nil
}

// takePosition adds ip to the bridge (a /32), so the lab's requests come
// from the spoofer's address; leavePosition removes it.
func (l *lab) takePosition(ctx context.Context, ip netip.Addr) error {
	if err := l.ipNS(ctx, "addr", "add", ip.String()+"/32", "dev", l.ns.Bridge); err != nil {
		return err
	}
	l.spoof.local = ip.String()
	return nil
}

func (l *lab) leavePosition(ctx context.Context) error {
	if l.spoof.local == "" {
		return nil
	}
	err := l.ipNS(ctx, "addr", "del", l.spoof.local+"/32", "dev", l.ns.Bridge)
	l.spoof.local = ""
	return err
}

var (
	reBootToken = regexp.MustCompile(`machina\.token=([A-Za-z0-9_.~+/=-]+)`)
	reDoneToken = regexp.MustCompile(`"doneToken":"([^"]+)"`)
	reJoinToken = regexp.MustCompile(`"joinToken":"([^"]+)"`)
)

// spoofPlan is the spoofing attempt at the plan: with vm-trust's EK pinned
// and its deploy started (profile count 1), vm-trust's cable is pulled
// and the spoofer boots with its MAC. It gets vm-trust's address and boot
// script (with a plan token, read here off the wire), and its agent
// attests with its own TPM (its own EK and AK, a quote from its own AK):
// the controller refuses the attestation (EK not the pinned one: event
// machine.attestation_refused, status condition TPMAttested=False
// EKMismatch) and serves no plan. The lab then sends, from the spoofer's
// address, the plan request with the captured token and no attestation:
// refused (attestation_required). The spoofer is then powered off and
// vm-trust's cable put back; vm-trust is reset into its deploy.
func (l *lab) spoofPlan(ctx context.Context, ek string) error {
	seq := l.lastEventSeq(ctx)
	if err := l.push(ctx, "profile "+TrustProfile+": count 1", func() error {
		return replaceFile(filepath.Join(l.clone, "profiles.yaml"), "    count: 0\n    join:\n      site: vmtrust", "    count: 1\n    join:\n      site: vmtrust")
	}); err != nil {
		return err
	}
	if err := l.waitServers(ctx, TrustMachine+" deploying", l.scale(3*time.Minute), func(ss []v1.Server) error {
		return l.lifecycles(ss, map[string]string{TrustMachine: "deploying"}, false)
	}); err != nil {
		return err
	}
	if err := l.startSpoofer(ctx); err != nil {
		return err
	}
	ev, err := l.waitEvent(ctx, seq, "machine.attestation_refused", attestation.ErrEKMismatch.Error(), l.scale(8*time.Minute))
	if err != nil {
		return err
	}
	l.log.Info("spoofer's attestation refused", "event", ev.Message)
	if err := l.waitStatus(ctx, gitops.ServerStatusPath(TrustMachine), "EKMismatch"); err != nil {
		return err
	}
	sp := l.spoof
	toks := sp.sn.find(reBootToken)
	if len(toks) == 0 {
		return errors.New("vm lab: the spoofer's boot script was not seen on the wire")
	}
	sp.planToken, sp.ip = toks[len(toks)-1].Value, toks[len(toks)-1].To.Addr()
	if err := sp.vm.Reset(ctx, "ForceOff"); err != nil {
		return err
	}
	// The spoofer's own plan request, and one from its position with the
	// captured token and no attestation: neither gets a plan.
	if err := l.noPlanServed(); err != nil {
		return err
	}
	if err := l.takePosition(ctx, sp.ip); err != nil {
		return err
	}
	c := l.attackerClient(sp.ip)
	base := fmt.Sprintf("http://%s:%d", BridgeAddr, APIPort)
	a, err := l.attack(ctx, c, "plan with the spoofer's plan token, no attestation", http.MethodGet, base+v1.PathAgentPlan, sp.planToken, nil)
	if lerr := l.leavePosition(ctx); err == nil {
		err = lerr
	}
	if err != nil {
		return err
	}
	if a.status != http.StatusForbidden || !strings.Contains(a.body, v1.CodeAttestationRequired) {
		return fmt.Errorf("vm lab: the spoofer's plan request was answered %d %s, want 403 %s", a.status, a.body, v1.CodeAttestationRequired)
	}
	if _, err := l.waitEvent(ctx, seq, "machine.attestation_refused", "plan refused: no verified TPM attestation (EK "+ek+" pinned)", l.scale(2*time.Minute)); err != nil {
		return err
	}
	if err := l.noPlanServed(); err != nil {
		return err
	}
	if err := l.waitServers(ctx, TrustMachine+" still deploying", time.Minute, func(ss []v1.Server) error {
		return l.lifecycles(ss, map[string]string{TrustMachine: "deploying"}, false)
	}); err != nil {
		return err
	}
	// vm-trust back on the wire, reset into its deploy's network boot.
	m, tap, err := l.trustTap()
	if err != nil {
		return err
	}
	if err := l.ipNS(ctx, "link", "set", sp.tap, "nomaster"); err != nil {
		return err
	}
	if err := l.ipNS(ctx, "link", "set", tap, "master", l.ns.Bridge); err != nil {
		return err
	}
	reset := "ForceRestart"
	if m.vm.Pid() == 0 {
		reset = "On"
	}
	return m.vm.Reset(ctx, reset)
}

// noPlanServed checks the controller's log: no deploy plan was served to
// vm-trust.
func (l *lab) noPlanServed() error {
	b, err := os.ReadFile(filepath.Join(l.dir, "controller.log"))
	if err != nil {
		return fmt.Errorf("vm lab: %w", err)
	}
	for _, ln := range strings.Split(string(b), "\n") {
		if strings.Contains(ln, "deploy plan served") && strings.Contains(ln, "machine="+TrustMachine) {
			return fmt.Errorf("vm lab: a deploy plan was served for %s while only the spoofer asked: %s", TrustMachine, ln)
		}
	}
	return nil
}

// verifiedAttestations counts the controller log's verified attestations
// of vm-trust.
func (l *lab) verifiedAttestations() (int, error) {
	b, err := os.ReadFile(filepath.Join(l.dir, "controller.log"))
	if err != nil {
		return 0, fmt.Errorf("vm lab: %w", err)
	}
	n := 0
	for _, ln := range strings.Split(string(b), "\n") {
		if strings.Contains(ln, "attestation verified") && strings.Contains(ln, "machine="+TrustMachine) {
			n++
		}
	}
	return n, nil
}

// deployTrust waits for vm-trust, back on the wire after the spoofer, to
// deploy the lab OS image with a quote before each of its plan and done
// (the controller log's verified attestations: the commissioning report's,
// then at least two more), and for its first boot from disk under Secure
// Boot to join.
func (l *lab) deployTrust(ctx context.Context, before int) error {
	if err := l.waitServers(ctx, TrustMachine+" deployed", l.scale(14*time.Minute), func(ss []v1.Server) error {
		return l.lifecycles(ss, map[string]string{TrustMachine: "deployed"}, false)
	}); err != nil {
		return err
	}
	n, err := l.verifiedAttestations()
	if err != nil {
		return err
	}
	if n < before+2 {
		return fmt.Errorf("vm lab: %d verified attestations of %s after its deploy, want at least %d (plan and done)", n, TrustMachine, before+2)
	}
	b, err := os.ReadFile(filepath.Join(l.dir, "controller.log"))
	if err != nil {
		return err
	}
	if !strings.Contains(string(b), "deploy plan served") {
		return errors.New("vm lab: the controller log has no deploy plan served")
	}
	l.log.Info("verified attestations", "machine", TrustMachine, "count", n)
	return nil
}

// trustHostChecks logs in to the deployed vm-trust and checks the OS
// booted with Secure Boot on (the SecureBoot UEFI variable is 1 and the
// kernel says so), that it joined, and that it heartbeats.
func (l *lab) trustHostChecks(ctx context.Context) (string, error) {
	if err := l.waitHosts(ctx, []string{TrustMachine}, l.scale(8*time.Minute)); err != nil {
		return "", err
	}
	m, _, err := l.trustTap()
	if err != nil {
		return "", err
	}
	fctx, cancel := context.WithTimeout(ctx, l.scale(3*time.Minute))
	ip, err := l.findHost(fctx, m)
	cancel()
	if err != nil {
		return "", fmt.Errorf("vm lab: %s: %w", TrustMachine, err)
	}
	// SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c: 4 bytes of
	// attributes, then the value (UEFI 2.10 §3.3, EFI_GLOBAL_VARIABLE).
	out, err := l.ssh(ctx, ip, "", "sudo sh -c 'od -An -tu1 /sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c; dmesg | grep -i \"secure boot\"; command -v mokutil >/dev/null && mokutil --sb-state; true'")
	if err != nil {
		return "", fmt.Errorf("vm lab: ssh %s (%s): %w: %s", TrustMachine, ip, err, out)
	}
	// od's line is the variable's attributes (4 bytes) and its value.
	sbVar := regexp.MustCompile(`(?m)^\s*\d+\s+\d+\s+\d+\s+\d+\s+(\d+)\s*$`).FindStringSubmatch(out)
	if sbVar == nil || sbVar[1] != "1" {
		return "", fmt.Errorf("vm lab: %s's SecureBoot variable is not 1: %s", TrustMachine, out)
	}
	if !strings.Contains(out, "Secure boot enabled") {
		return "", fmt.Errorf("vm lab: %s's kernel log does not say Secure boot enabled: %s", TrustMachine, out)
	}
	l.log.Info("deployed OS under Secure Boot", "machine", TrustMachine, "ip", ip, "checks", out)
	// Heartbeats: the host's last heartbeat moves on.
	seen := func() (time.Time, error) {
		c, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		hs, err := l.api.Hosts(c)
		if err != nil {
			return time.Time{}, err
		}
		for _, h := range hs.Items {
			if h.Server == TrustMachine {
				return h.LastSeen, nil
			}
		}
		return time.Time{}, errors.New("no host of " + TrustMachine)
	}
	first, err := seen()
	if err != nil {
		return "", err
	}
	deadline := time.Now().Add(l.scale(time.Minute))
	for {
		last, err := seen()
		if err == nil && last.After(first) {
			break
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("vm lab: %s's host sent no heartbeat after %s within a minute", TrustMachine, first)
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(2 * time.Second):
		}
	}
	return ip, nil
}

// spoofReplay is the spoofer's try at done and join: vm-trust is powered
// off and the spoofer takes its MAC's address, replaying what it read off
// the wire during vm-trust's deploy (the plan token of its boot script,
// the done and enrolment tokens of its plan answer): each is refused,
// and vm-trust's server and host records are unchanged.
func (l *lab) spoofReplay(ctx context.Context, ip string) ([]attempt, error) {
	sp := l.spoof
	plans, dones, joins := sp.sn.find(reBootToken), sp.sn.find(reDoneToken), sp.sn.find(reJoinToken)
	if len(plans) < 2 || len(dones) == 0 || len(joins) == 0 {
		return nil, fmt.Errorf("vm lab: captured %d boot-script tokens, %d done tokens, %d enrolment tokens: want the spoofer's and vm-trust's plan tokens and vm-trust's plan answer", len(plans), len(dones), len(joins))
	}
	planTok, doneTok, joinTok := plans[len(plans)-1].Value, dones[len(dones)-1].Value, joins[len(joins)-1].Value
	if planTok == sp.planToken {
		return nil, errors.New("vm lab: no plan token of vm-trust's own boot was captured")
	}
	m, _, err := l.trustTap()
	if err != nil {
		return nil, err
	}
	before, err := l.trustRecords(ctx)
	if err != nil {
		return nil, err
	}
	if err := m.vm.Reset(ctx, "ForceOff"); err != nil {
		return nil, err
	}
	addr, err := netip.ParseAddr(ip)
	if err != nil {
		return nil, err
	}
	if err := l.takePosition(ctx, addr); err != nil {
		return nil, err
	}
	defer func() { _ = l.leavePosition(ctx) }()
	c := l.attackerClient(addr)
	base := fmt.Sprintf("http://%s:%d", BridgeAddr, APIPort)
	csr, err := attackerCSR(TrustMachine)
	if err != nil {
		return nil, err
	}
	done := v1.DeployResult{OK: true, BootMAC: m.mac, SHA256: strings.Repeat("0", 64), BytesWritten: 1}
	var as []attempt
	for _, r := range []struct {
		what, method, url, token string
		body                     any
	}{
		{"plan: vm-trust's captured plan token (used)", http.MethodGet, base + v1.PathAgentPlan, planTok, nil},
		{"plan: the spoofer's own plan token, no attestation", http.MethodGet, base + v1.PathAgentPlan, sp.planToken, nil},
		{"done: vm-trust's captured done token (used), a forged outcome", http.MethodPost, base + v1.PathAgentDone, doneTok, done},
		{"done: the spoofer's plan token", http.MethodPost, base + v1.PathAgentDone, sp.planToken, done},
		{"join: vm-trust's captured enrolment token (used)", http.MethodPost, fmt.Sprintf("https://%s:%d/hosts/join", BridgeAddr, JoinPort), "",
			v1.JoinRequest{Token: joinTok, CSR: csr, Facts: v1.HostFacts{Hostname: TrustMachine}}},
		{"join: the spoofer's plan token as an enrolment token", http.MethodPost, fmt.Sprintf("https://%s:%d/hosts/join", BridgeAddr, JoinPort), "",
			v1.JoinRequest{Token: sp.planToken, CSR: csr, Facts: v1.HostFacts{Hostname: TrustMachine}}},
	} {
		a, err := l.attack(ctx, c, r.what, r.method, r.url, r.token, r.body)
		if err != nil {
			return as, err
		}
		as = append(as, a)
	}
	after, err := l.trustRecords(ctx)
	if err != nil {
		return as, err
	}
	if after != before {
		return as, fmt.Errorf("vm lab: %s's records changed under the spoofer's requests:\nbefore %s\nafter  %s", TrustMachine, before, after)
	}
	return as, nil
}

// trustRecords renders what the spoofer must not change: vm-trust's
// lifecycle and TPM, its host's join and certificate.
func (l *lab) trustRecords(ctx context.Context) (string, error) {
	c, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	s, err := l.api.Server(c, TrustMachine)
	if err != nil {
		return "", err
	}
	hs, err := l.api.Hosts(c)
	if err != nil {
		return "", err
	}
	var host string
	for _, h := range hs.Items {
		if h.Server == TrustMachine || h.Name == TrustMachine {
			host += fmt.Sprintf(" host %s joined %s at %s", h.Name, h.JoinStatus, h.JoinedAt.UTC().Format(time.RFC3339Nano))
		}
	}
	status, _ := readHead(l.bare, gitops.ServerStatusPath(TrustMachine))
	ek := regexp.MustCompile(`ek: "?(sha256:[0-9a-f]{64})`).FindString(status)
	return fmt.Sprintf("lifecycle %s, %s;%s", s.Lifecycle, ek, host), nil
}

// attackerCSR is a PKCS #10 request for a node certificate of host, from
// a key the attacker made.
func attackerCSR(host string) (string, error) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", err
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: host}, DNSNames: []string{host}}, k)
	if err != nil {
		return "", err
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})), nil
}
