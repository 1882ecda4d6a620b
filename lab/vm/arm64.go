package vm

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/gitops"
	"github.com/machina-metal/machina/lab/vm/osimage"
	"github.com/machina-metal/machina/lab/vm/vmpower"
)

// ARM64Budget is the time the arm64 lab (Config.ARM64) must stay under on
// a 2-core machine under TCG, the cached OS image excepted.
const ARM64Budget = 12 * time.Minute

// ARM64Machine is the arm64 lab's one server: its servers.yaml entry
// states no arch, so what the plan knows of it comes from commissioning.
const ARM64Machine = "vm-arm64"

// The arm64 lab's profile and image: the minimal arm64 OS
// (lab/vm/osimage/build-arm64.sh, make os-image-arm64), arch arm64 in
// images.yaml.
const (
	ARM64Profile = "lab-arm64"
	ARM64Image   = "lab-os-arm64"
)

// armImageDir holds the arm64 OS image and its SHA256SUMS.
func (l *lab) armImageDir() string {
	return filepath.Join(l.cfg.Root, "out", "os-image-arm64")
}

// armImageYAML is the arm64 image's images.yaml entry ("" outside the
// arm64 lab).
func (l *lab) armImageYAML() string {
	if !l.cfg.ARM64 {
		return ""
	}
	return fmt.Sprintf("  - name: %s\n    arch: arm64\n    url: %s/%s\n    checksumURL: %s/%s\n", ARM64Image, l.armMirror, osimage.ImageFile, l.armMirror, osimage.SumsFile)
}

// armProfileYAML is the arm64 profile's profiles.yaml entry, count 0
// (the lab pins it), with the lab profile's keys and join ("" outside the
// arm64 lab).
func (l *lab) armProfileYAML() string {
	if !l.cfg.ARM64 {
		return ""
	}
	return `  - name: ` + ARM64Profile + `
    image: ` + ARM64Image + `
    deploy: image
    sshKeys:
      - "` + l.sshPub + `"
    zone: lab
    min: {cores: 1, memoryGiB: 1, diskGiB: 2}
    count: 0
    join:
      site: vmlab
      tags: [vm, arm64]
      networks:
        - {name: lab, bridge: br-lab, nic: ` + GuestNIC + `, cidr: ` + Subnet + `}
`
}

// machines returns the lab's VMs for l.cfg: the five amd64 VMs, the
// arm64 lab's one, or the host lab's one (host.go).
func (l *lab) machines() []*machine {
	if l.cfg.Trust {
		// Redfish over vmpower with the DMTF tree (it has a SecureBoot
		// resource, which the firmware step sets; the VM's Secure Boot
		// itself comes from its OVMF variables).
		return []*machine{{name: TrustMachine, zone: "lab", mac: "52:54:00:15:00:01", fw: vmpower.UEFI, driver: "redfish", tree: "dmtf-public-rackmount1", trust: true}}
	}
	if l.cfg.Host {
		return l.hostMachines()
	}
	if l.cfg.ARM64 {
		// Redfish over vmpower with the DMTF tree, PXE (its override
		// targets list Pxe): AAVMF's network boot asks DHCP with client
		// architecture 11 and gets the GRUB image.
		return []*machine{{name: ARM64Machine, zone: "lab", mac: "52:54:00:28:00:01", fw: vmpower.UEFIARM64, driver: "redfish", tree: "dmtf-public-rackmount1"}}
	}
	return []*machine{
		{name: "vm-bios", zone: "lab", mac: "52:54:00:14:00:01", fw: vmpower.BIOS, driver: "redfish", tree: "dell-poweredge-r750-idrac9", vmedia: true},
		{name: "vm-uefi", zone: "lab", mac: "52:54:00:14:00:02", fw: vmpower.UEFI, driver: "redfish", tree: "dmtf-public-rackmount1"},
		// Network first: its boot order keeps the NIC first whatever the
		// BMC is told (machine.networkFirst). It has the least memory
		// (memoryMiB), so the profile's allocation (smallest first) always
		// deploys it.
		{name: "vm-ipmi", zone: "lab", mac: "52:54:00:14:00:03", fw: vmpower.BIOS, driver: "ipmi", networkFirst: true},
		{name: "vm-uefi-media", zone: "lab", mac: "52:54:00:14:00:04", fw: vmpower.UEFI, driver: "redfish", tree: "dell-poweredge-r750-idrac9", vmedia: true},
		{name: PyghmiMachine, zone: "lab", mac: "52:54:00:14:00:05", fw: vmpower.BIOS, driver: "ipmi", pyghmi: true},
	}
}

// memoryMiB is m's guest memory: the arm64 VM 1536 MiB; the amd64 VMs
// WaveMemoryMiB (so their deploys share pieces, wave.go), 256 MiB more
// but for the network-first machine, so that plan.Candidates (smallest
// memory first) deploys it.
func (m *machine) memoryMiB() int {
	switch {
	case m.fw == vmpower.UEFIARM64:
		return 1536
	case m.networkFirst:
		return WaveMemoryMiB
	}
	return WaveMemoryMiB + 256
}

// cpus is m's vCPU count: one for the amd64 VMs (five share two host
// cores), two for the arm64 lab's only VM, whose TCG is multi-threaded.
func (m *machine) cpus() int {
	if m.fw == vmpower.UEFIARM64 || m.trust {
		return 2
	}
	return 1
}

// grubImage is the arm64 GRUB network image scripts/build-grub-arm64.sh
// writes (make lab-arm64 and make prep build it).
func (l *lab) grubImage() string {
	return filepath.Join(l.cfg.Root, "out", "boot", "grubnetaa64.efi")
}

// runARM64 is the arm64 lab: the arm64 VM network-boots
// through AAVMF → DHCP arch 11 → TFTP grubnetaa64.efi → machina-grub.cfg
// → /boot/grub → the arm64 ramdisk, commissions and reports arch arm64
// (API and status commit); then a pin of the amd64 profile onto it is
// refused with ArchMismatch/ImageArchitecture in the plan and the status
// commit, and the machine is never powered on or written.
func (l *lab) runARM64(ctx context.Context) error {
	t0 := time.Now()
	// The amd64 lab OS image: the image the refused profile names. It is
	// imported like any image; it must never reach the arm64 disk.
	img, sum, err := osimage.Ensure(ctx, l.cfg.ImageCache)
	if err != nil {
		return fmt.Errorf("vm lab: os image: %w", err)
	}
	l.step("os image (cached: "+filepath.Base(filepath.Dir(img))+")", t0)

	t0 = time.Now()
	if err := l.setup(ctx, img, sum); err != nil {
		return err
	}
	l.step("setup: netns, BMC, repository, controller with --grub-arm64", t0)
	m := l.ms[0]

	t0 = time.Now()
	if err := l.waitServers(ctx, ARM64Machine+" commissions to ready", l.scale(10*time.Minute), func(ss []v1.Server) error {
		if err := l.lifecycles(ss, map[string]string{ARM64Machine: "ready"}, true); err != nil {
			return err
		}
		for _, s := range ss {
			if s.Name == ARM64Machine && s.Hardware.Arch != "arm64" {
				return fmt.Errorf("vm lab: %s reported arch %q, want arm64", s.Name, s.Hardware.Arch)
			}
		}
		return nil
	}); err != nil {
		return err
	}
	for _, text := range []string{"lifecycle: ready", "arch: arm64", "cpu.arch: arm64"} {
		if err := l.waitStatus(ctx, gitops.ServerStatusPath(ARM64Machine), text); err != nil {
			return err
		}
	}
	if err := l.grubBooted(m); err != nil {
		return err
	}
	l.step("commission: "+ARM64Machine+" (AAVMF PXE → DHCP arch 11 → grubnetaa64.efi → machina-grub.cfg → /boot/grub → arm64 ramdisk) ready, arch arm64 in the API and the status commit", t0)

	t0 = time.Now()
	if err := l.refusedAMD64(ctx, m); err != nil {
		return err
	}
	l.step("deploy refused: "+ProfileName+" (image "+ImageName+", amd64) pinned onto "+ARM64Machine+": ArchMismatch/ImageArchitecture in the plan and the status commit; never allocated, powered on or written", t0)

	t0 = time.Now()
	if err := l.push(ctx, "pin profile "+ARM64Profile+" (arm64 image) onto "+ARM64Machine, func() error {
		return replaceFile(filepath.Join(l.clone, "servers.yaml"), "    profile: "+ProfileName+"\n", "    profile: "+ARM64Profile+"\n")
	}); err != nil {
		return err
	}
	if err := l.waitServers(ctx, ARM64Machine+" deployed with "+ARM64Image, l.scale(10*time.Minute), func(ss []v1.Server) error {
		for _, s := range ss {
			if s.Name != ARM64Machine {
				continue
			}
			if s.Lifecycle == "failed" {
				return fmt.Errorf("%s failed: %s", s.Name, s.LastError)
			}
			if s.Lifecycle != "deployed" {
				return fmt.Errorf("%s is %s", s.Name, s.Lifecycle)
			}
			return nil
		}
		return fmt.Errorf("no server %s", ARM64Machine)
	}); err != nil {
		return err
	}
	if err := l.waitStatus(ctx, gitops.ServerStatusPath(ARM64Machine), "lifecycle: deployed"); err != nil {
		return err
	}
	l.step("deploy: "+ARM64Profile+" pinned onto "+ARM64Machine+": the arm64 ramdisk wrote "+ARM64Image+" (arch arm64), verified it and added the NoCloud seed; deployed", t0)

	t0 = time.Now()
	if err := l.waitHosts(ctx, []string{ARM64Machine}, l.scale(8*time.Minute)); err != nil {
		return err
	}
	// The join answers before install.sh has installed and started the
	// node agent's unit: wait for the first boot to finish on the console,
	// then for the agent's heartbeats (they carry its version).
	serial := filepath.Join(m.vm.Config().Dir, vmpower.SerialLog)
	deadline := time.Now().Add(l.scale(3 * time.Minute))
	for _, want := range []string{"Machina lab arm64 OS: booting from disk", "NoCloud seed on /dev/vda", "machina-install: joined", "FIRST BOOT DONE", "starting machina-node.service"} {
		for {
			b, err := os.ReadFile(serial)
			if err != nil {
				return err
			}
			if strings.Contains(string(b), want) {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("vm lab: %s joined, but its serial log (%s) lacks %q", ARM64Machine, serial, want)
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(time.Second):
			}
		}
	}
	for {
		hc, cancel := context.WithTimeout(ctx, 20*time.Second)
		hs, err := l.api.Hosts(hc)
		cancel()
		var last string
		if err != nil {
			last = err.Error()
		}
		for _, h := range hs.Items {
			if h.Server == ARM64Machine {
				if h.Online && h.AgentVersion != "" {
					l.log.Info("arm64 host heartbeating", "host", h.Name, "agent", h.AgentVersion, "networks", h.Networks)
					l.step("first boot: "+ARM64Machine+" booted "+ARM64Image+" from its disk (AAVMF → GRUB → arm64 kernel), ran the seed's join command (curl, openssl, install.sh, the arm64 machina-node), joined with bridge network; the node agent's unit heartbeats", t0)
					return nil
				}
				last = fmt.Sprintf("online=%v agent=%q", h.Online, h.AgentVersion)
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("vm lab: %s: no heartbeat from its node agent: %s", ARM64Machine, last)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(2 * time.Second):
		}
	}
}

// grubBooted checks that m's commissioning boot came through GRUB: the
// serial console shows GRUB's network script fetching the arm64 kernel.
func (l *lab) grubBooted(m *machine) error {
	b, err := os.ReadFile(filepath.Join(m.vm.Config().Dir, vmpower.SerialLog))
	if err != nil {
		return fmt.Errorf("vm lab: %s serial log: %w", m.name, err)
	}
	// GRUB's echo of the per-machine script (boot/ipxe/grub.go; GRUB wraps
	// it at 80 columns, so its start only), the EFI stub, then the
	// arm64 kernel's first line on the PL011 console (console=ttyAMA0).
	for _, want := range []string{"Machina: " + m.mac + " (" + m.name + ") lifecycle=commissioning platform=efi", "EFI stub: Booting Linux Kernel", "Booting Linux on physical CPU"} {
		if !strings.Contains(string(b), want) {
			return fmt.Errorf("vm lab: %s: the serial log lacks %q (see %s)", m.name, want, filepath.Join(m.vm.Config().Dir, vmpower.SerialLog))
		}
	}
	return nil
}

// planCondition is the part of GET /api/v1/plan's conditions the lab reads
// (plan.Condition).
type planCondition struct {
	Subject, Type, Reason, Message string
}

// waitPlanCondition polls the admin API's plan every second until it has
// a condition of server with type typ and reason whose message contains
// every one of texts, and returns it; it fails after d naming the
// conditions it last saw.
func (l *lab) waitPlanCondition(ctx context.Context, server, typ, reason string, texts []string, d time.Duration) (planCondition, error) {
	deadline := time.Now().Add(d)
	var last string
	for {
		var plan struct {
			Conditions []planCondition `json:"conditions"`
		}
		if err := l.api.GetJSON(ctx, "/api/v1/plan", &plan); err != nil {
			last = err.Error()
		} else {
			last = fmt.Sprintf("%+v", plan.Conditions)
			for _, c := range plan.Conditions {
				if c.Subject == "server/"+server && c.Type == typ && c.Reason == reason && containsAll(c.Message, texts) {
					return c, nil
				}
			}
		}
		if time.Now().After(deadline) {
			return planCondition{}, fmt.Errorf("vm lab: no %s/%s plan condition for %s within %s: %s", typ, reason, server, d, last)
		}
		select {
		case <-ctx.Done():
			return planCondition{}, ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// containsAll reports whether s contains every one of subs.
func containsAll(s string, subs []string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

// refusedAMD64 pins the amd64 profile onto the arm64 machine and checks
// the refusal: the plan's ArchMismatch/ImageArchitecture condition, the
// same in the server's status commit, and, over a window of several
// reconcile passes, no allocation, no BMC power or boot request, the VM
// off and its disk unchanged.
func (l *lab) refusedAMD64(ctx context.Context, m *machine) error {
	disk := filepath.Join(m.vm.Config().Dir, "disk.raw")
	before, err := diskBlocks(disk)
	if err != nil {
		return err
	}
	// Commissioning powers the machine off at the end; wait for it so that
	// the check below sees the controller's doing only.
	wctx, cancel := context.WithTimeout(ctx, l.scale(2*time.Minute))
	err = m.vm.WaitOff(wctx)
	cancel()
	if err != nil {
		return fmt.Errorf("vm lab: %s still on after commissioning: %w", m.name, err)
	}
	nreq := len(m.bmc.Requests())
	if err := l.push(ctx, "pin profile "+ProfileName+" (amd64 image) onto "+ARM64Machine, func() error {
		return replaceFile(filepath.Join(l.clone, "servers.yaml"), "  - name: "+ARM64Machine+"\n", "  - name: "+ARM64Machine+"\n    want: deployed\n    profile: "+ProfileName+"\n")
	}); err != nil {
		return err
	}
	want := "profile " + ProfileName + "'s image " + ImageName + " is amd64; this server is arm64 (reported by commissioning)"
	c, err := l.waitPlanCondition(ctx, ARM64Machine, "ArchMismatch", "ImageArchitecture", []string{want}, l.scale(2*time.Minute))
	if err != nil {
		return err
	}
	l.log.Info("plan refuses the amd64 image", "condition", c.Type+"/"+c.Reason, "message", c.Message)
	for _, text := range []string{"type: ArchMismatch", "reason: ImageArchitecture", "is amd64; this server is arm64"} {
		if err := l.waitStatus(ctx, gitops.ServerStatusPath(ARM64Machine), text); err != nil {
			return err
		}
	}
	// Several reconcile passes (poll 2s; push asks for one at once): the
	// refusal holds and nothing touches the machine.
	hold := time.Now().Add(30 * time.Second)
	for time.Now().Before(hold) {
		ss, err := l.listServers()
		if err != nil {
			return err
		}
		for _, s := range ss {
			if s.Name != ARM64Machine {
				continue
			}
			if s.Lifecycle != "ready" || s.Allocation != nil {
				return fmt.Errorf("vm lab: %s is %s with allocation %+v after the refused pin, want ready and unallocated", s.Name, s.Lifecycle, s.Allocation)
			}
		}
		if pid := m.vm.Pid(); pid != 0 {
			return fmt.Errorf("vm lab: %s powered on (pid %d) after the refused pin", m.name, pid)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(2 * time.Second):
		}
	}
	for _, r := range m.bmc.Requests()[nreq:] {
		if r.Method != http.MethodGet && !strings.HasSuffix(r.Path, "/Sessions") && !strings.Contains(r.Path, "/Sessions/") {
			return fmt.Errorf("vm lab: %s's BMC got %s %s after the refused pin", m.name, r.Method, r.Path)
		}
	}
	after, err := diskBlocks(disk)
	if err != nil {
		return err
	}
	if after != before {
		return fmt.Errorf("vm lab: %s's disk changed after the refused pin (%d → %d blocks)", m.name, before, after)
	}
	return nil
}

// diskBlocks returns the allocated 512-byte blocks of the sparse raw disk
// at path: any write to it allocates more.
func diskBlocks(path string) (int64, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return 0, fmt.Errorf("vm lab: %w", err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, errors.New("vm lab: no block count for " + path)
	}
	return st.Blocks, nil
}
