package vm

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
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
const TrustBudget = 12 * time.Minute

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
`
}

// startSWTPM starts m's software TPM 2.0 (swtpm, Debian package swtpm)
// on a control socket in dir, its state in dir/tpm, and returns the qemu
// arguments that attach it as a TIS TPM. swtpm outlives qemu's starts and
// stops (the controller powers the VM off and on), so the EK stays the
// same; close ends it by its PID.
func (l *lab) startSWTPM(m *machine, dir string) ([]string, error) {
	state := filepath.Join(dir, "tpm")
	if err := os.MkdirAll(state, 0o700); err != nil {
		return nil, fmt.Errorf("vm lab: %w", err)
	}
	// swtpm_setup creates the EK and its certificate the way a TPM
	// vendor does (and as libvirt does for its TPMs).
	if out, err := exec.Command("swtpm_setup", "--tpm2", "--tpmstate", state, "--create-ek-cert", "--create-platform-cert",
		"--lock-nvram", "--overwrite", "--display").CombinedOutput(); err != nil {
		return nil, fmt.Errorf("vm lab: swtpm_setup: %w: %s", err, out)
	}
	sock := filepath.Join(dir, "swtpm.sock")
	log, err := os.Create(filepath.Join(dir, "swtpm.log"))
	if err != nil {
		return nil, fmt.Errorf("vm lab: %w", err)
	}
	cmd := exec.Command("swtpm", "socket", "--tpm2", "--tpmstate", "dir="+state, "--ctrl", "type=unixio,path="+sock, "--log", "level=1")
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		log.Close()
		return nil, fmt.Errorf("vm lab: swtpm: %w", err)
	}
	log.Close()
	m.swtpm = cmd
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat(sock); err == nil {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("vm lab: swtpm made no socket %s within 10s (see %s)", sock, filepath.Join(dir, "swtpm.log"))
		}
		time.Sleep(50 * time.Millisecond)
	}
	return []string{"-machine", "smm=on", "-global", "driver=cfi.pflash01,property=secure,value=on",
		"-chardev", "socket,id=chrtpm,path=" + sock, "-tpmdev", "emulator,id=tpm0,chardev=chrtpm", "-device", "tpm-tis,tpmdev=tpm0"}, nil
}

// stopSWTPM ends m's swtpm by its PID.
func (m *machine) stopSWTPM() {
	if m.swtpm == nil || m.swtpm.Process == nil {
		return
	}
	_ = m.swtpm.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = m.swtpm.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		_ = m.swtpm.Process.Kill()
		<-done
	}
	m.swtpm = nil
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
	return nil
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
