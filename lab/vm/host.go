package vm

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/gitops"
	"github.com/machina-metal/machina/lab/vm/osimage"
	"github.com/machina-metal/machina/lab/vm/vmpower"
)

// The host lab (Config.Host, TestVMLabHost): one VM built like a
// production server, driven through the whole life of a host.
//
//   - vm-host: OVMF (UEFI), a TPM 2.0 (qemu tpm-crb on a swtpm the lab
//     starts, state in the lab folder), two virtio NICs on two taps, two
//     virtio disks and one NVMe disk, behind a bmcsim Redfish BMC (DMTF
//     tree, PXE).
//   - The switch: the namespace's bridge for untagged provisioning
//     traffic, VLAN hostVLAN tagged on both VM ports and terminated with the
//     gateway hostGateway (vlanGateway: user space, as the lab host's kernel
//     may lack 802.1Q and bridge VLAN filtering), MTU 9000, and Debian's
//     lldpd sending LLDP on each VM port as switch hostSwitch, ports
//     hostPort0 and hostPort1.
//   - Its profile: attestation required; an active-backup bond of the two
//     NICs, a tagged VLAN on it, a bridge on the VLAN with the server's
//     address and the default route, MTU 9000; a RAID1 root across the two
//     virtio disks and a volume group on the NVMe disk; erase zero.
//
// Steps: commissioning with the cabling expectation swapped
// (CablingMismatch), then fixed in Git; deploy, first boot and join, with
// the host's links, addresses, RAID, LVM and attestation checked over SSH
// and from the controller; a boot with one RAID member pulled (degraded,
// heartbeating); release with erase zero and the disk images read back.
const (
	// HostMachine is the host lab's one server.
	HostMachine = "vm-host"
	// HostProfile is its profile (pinned in servers.yaml).
	HostProfile = "host"
	// HostBudget is the time the host lab must stay under on a 2-core
	// machine under TCG, the cached OS image excepted.
	HostBudget = 12 * time.Minute
)

// Facts of the host lab's server and switch.
const (
	hostMAC0, hostMAC1   = "52:54:00:40:00:01", "52:54:00:40:00:02"
	hostSwitch           = "leaf-lab"
	hostPort0, hostPort1 = "Ethernet1/1", "Ethernet1/2"
	hostVLAN             = 100
	hostSubnet           = "hostnet"
	hostCIDR             = "10.98.100.0/24"
	hostGateway          = "10.98.100.1"
	// hostAddr is vm-host's fixed address on hostSubnet (servers.yaml
	// network.addresses), outside the pool.
	hostAddr                    = "10.98.100.21"
	hostPoolStart, hostPoolEnd  = "10.98.100.100", "10.98.100.199"
	hostBridge                  = "br-host"
	hostVLANIf                  = "bond0.100"
	hostRootDiskBytes           = 2 << 30
	hostNVMeBytes               = 1536 << 20
	hostRootSerial, hostNVMeSer = "MLAB-ROOT-B", "MLABNVME0001"
)

// gatewayReply is the size of the gateway endpoint's answer.
const gatewayReply = 4 << 20

// hostAddressMode is the address mode of the bridge on hostSubnet:
// "fixed" (hostAddr, from servers.yaml) or "pool" (the controller's IPAM
// hands one out of hostPoolStart..hostPoolEnd). It is the only line to
// change between the two: servers.yaml then carries no address, and the
// lab finds the host's address in the controller's join log and checks
// that it lies in the pool.
const hostAddressMode = "pool"

// hostLab is the host lab's own state: the swtpm and the disk files.
type hostLab struct {
	tpm   *swtpm
	vmDir string
	// addr is the host's address on hostSubnet once known.
	addr string
	// gw terminates VLAN hostVLAN of the VM's ports (vlanport.go);
	// gwURL is an HTTP endpoint on the gateway's address.
	gw    *vlanGateway
	gwURL string
	// marker is written into the root and the data volume at first boot
	// and must be gone from every disk image after the erase.
	marker string
}

// lldpWait is the controller's --lldp-wait: the host lab's lldpd sends
// every second; the five-VM lab has no LLDP sender.
func (l *lab) lldpWait() string {
	if l.cfg.Host {
		return "8s"
	}
	return "3s"
}

func (l *lab) hostMachines() []*machine {
	m := &machine{name: HostMachine, zone: "lab", mac: hostMAC0, fw: vmpower.UEFI, driver: "redfish", tree: "dmtf-public-rackmount1",
		extraMACs: []string{hostMAC1}, diskBytes: hostRootDiskBytes}
	m.tune = func(cfg *vmpower.Config) error { return l.hostTune(cfg) }
	m.preStart = func(context.Context) error { return l.host.tpm.ensure() }
	return []*machine{m}
}

// hostDevices is vm-host's qemu devices after the first disk: the second
// root disk (unless pulled), the NVMe disk and the TPM.
func (h *hostLab) hostDevices(secondRoot bool) []string {
	var a []string
	if secondRoot {
		a = append(a, "-drive", "file="+filepath.Join(h.vmDir, "disk1.raw")+",format=raw,if=none,id=disk1,cache=unsafe",
			"-device", "virtio-blk-pci,drive=disk1,serial="+hostRootSerial)
	}
	a = append(a, "-drive", "file="+filepath.Join(h.vmDir, "nvme.raw")+",format=raw,if=none,id=nvm0,cache=unsafe",
		"-device", "nvme,drive=nvm0,serial="+hostNVMeSer)
	return append(a, h.tpm.qemuArgs("tpm-crb")...)
}

// hostDisks are vm-host's disk image files: the two root disks and the NVMe.
func (h *hostLab) hostDisks() []string {
	return []string{filepath.Join(h.vmDir, "disk.raw"), filepath.Join(h.vmDir, "disk1.raw"), filepath.Join(h.vmDir, "nvme.raw")}
}

// hostTune makes vm-host's disks, starts its swtpm and the switch side
// (VLAN filtering, the gateway, lldpd), and adds the devices to cfg.
func (l *lab) hostTune(cfg *vmpower.Config) error {
	h := l.host
	h.vmDir = cfg.Dir
	cfg.CPUs = 2
	// Enough memory that the ramdisk verifies the image (512 MiB) in memory
	// (its limit is a quarter of RAM) and downloads it once, not twice.
	cfg.MemoryMiB = 4608
	for name, size := range map[string]int64{"disk1.raw": hostRootDiskBytes, "nvme.raw": hostNVMeBytes} {
		p := filepath.Join(cfg.Dir, name)
		if err := os.WriteFile(p, nil, 0o644); err != nil {
			return err
		}
		if err := os.Truncate(p, size); err != nil {
			return err
		}
	}
	if err := l.setupHostSWTPM(); err != nil {
		return err
	}
	cfg.ExtraArgs = h.hostDevices(true)
	if len(cfg.NICs) != 2 {
		return fmt.Errorf("host lab: want 2 NICs, have %d", len(cfg.NICs))
	}
	// The guest computes its own checksums and sends no TSO frames: the
	// VLAN gateway forwards frames as AF_PACKET sees them on the taps.
	for i := range cfg.NICs {
		cfg.NICs[i].Options = "csum=off"
	}
	return l.hostSwitchUp(cfg.NICs[0].Tap, cfg.NICs[1].Tap)
}

// setupHostSWTPM manufactures vm-host's TPM 2.0 with an EK and the
// SHA-256 PCR bank in the lab folder; its swtpm starts before each qemu
// start (swtpm.ensure).
func (l *lab) setupHostSWTPM() error {
	h := l.host
	dir := filepath.Join(h.vmDir, "tpm")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	conf := filepath.Join(dir, "swtpm_setup.conf")
	if err := os.WriteFile(conf, []byte("active_pcr_banks = sha256\n"), 0o600); err != nil {
		return err
	}
	t, err := newSWTPM(dir, "--config", conf, "--createek")
	if err != nil {
		return fmt.Errorf("host lab: %w", err)
	}
	h.tpm = t
	return nil
}

// hostSwitchUp configures the namespace as the top-of-rack switch of
// vm-host's two ports: untagged (provisioning) through the bridge as
// before, VLAN hostVLAN tagged on both ports and terminated by a
// vlanGateway on its tap gw100 with the gateway address, MTU 9000 on the
// ports and the gateway; and lldpd sending LLDP on each port.
func (l *lab) hostSwitchUp(tap0, tap1 string) error {
	ns := l.ns.Name
	gw := netip.MustParsePrefix(hostCIDR)
	cmds := [][]string{
		{"ip", "-n", ns, "link", "set", tap0, "mtu", "9000"},
		{"ip", "-n", ns, "link", "set", tap1, "mtu", "9000"},
	}
	for _, c := range cmds {
		if out, err := exec.Command(c[0], c[1:]...).CombinedOutput(); err != nil {
			return fmt.Errorf("host lab: switch: %s: %w: %s", strings.Join(c, " "), err, out)
		}
	}
	g, err := startVLANGateway(ns, hostVLAN, []string{tap0, tap1}, "gw100")
	if err != nil {
		return fmt.Errorf("host lab: VLAN %d gateway: %w", hostVLAN, err)
	}
	l.host.gw = g
	for _, c := range [][]string{
		{"ip", "-n", ns, "link", "set", "gw100", "mtu", "9000", "up"},
		{"ip", "-n", ns, "addr", "add", hostGateway + "/" + fmt.Sprint(gw.Bits()), "dev", "gw100"},
	} {
		if out, err := exec.Command(c[0], c[1:]...).CombinedOutput(); err != nil {
			return fmt.Errorf("host lab: switch: %s: %w: %s", strings.Join(c, " "), err, out)
		}
	}
	// An HTTP endpoint on the gateway's own address (the switch's SVI):
	// the host posts to it and reads gatewayReply bytes back.
	ln, err := listenIn(ns, hostGateway+":0")
	if err != nil {
		return fmt.Errorf("host lab: listen on the gateway: %w", err)
	}
	hs := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = w.Write(make([]byte, gatewayReply))
	})}
	l.servers = append(l.servers, hs)
	l.wg.Add(1)
	go func() { defer l.wg.Done(); _ = hs.Serve(ln) }()
	l.host.gwURL = "http://" + ln.Addr().String() + "/"
	// lldpd drops privileges to _lldpd, which must reach its control
	// socket in the lab folder.
	dir := filepath.Join(l.dir, "lldpd")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, d := range []string{l.dir, dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			return err
		}
	}
	conf := filepath.Join(dir, "lldpd.conf")
	if err := os.WriteFile(conf, []byte(fmt.Sprintf(`configure system hostname %s
configure lldp tx-interval 1
configure ports %s lldp portidsubtype local %s description "%s nic0"
configure ports %s lldp portidsubtype local %s description "%s nic1"
`, hostSwitch, tap0, hostPort0, HostMachine, tap1, hostPort1, HostMachine)), 0o644); err != nil {
		return err
	}
	lldpcli, err := exec.LookPath("lldpcli")
	if err != nil {
		return fmt.Errorf("%w: lldpcli not in PATH (Debian package lldpd)", ErrPrereq)
	}
	logf, err := os.Create(filepath.Join(dir, "lldpd.log"))
	if err != nil {
		return err
	}
	cmd := l.ns.Command(context.Background(), "lldpd", "-d", "-u", filepath.Join(dir, "lldpd.socket"), "-I", tap0+","+tap1, "-C", tap0+","+tap1, "-O", conf, "-L", lldpcli)
	cmd.Stdout, cmd.Stderr = logf, logf
	if _, err := l.ns.Start(cmd); err != nil {
		return fmt.Errorf("host lab: lldpd: %w", err)
	}
	return nil
}

// hostClose powers vm-host off and ends its swtpm by PID.
func (l *lab) hostClose() {
	h := l.host
	for _, m := range l.ms {
		if m.vm != nil {
			_ = m.vm.Reset(context.Background(), "ForceOff")
		}
	}
	h.tpm.stop()
	if h.gw != nil {
		h.gw.close()
	}
}

// hostServersYAML is servers.yaml with vm-host pinned to HostProfile; with
// swapped, its NICs' cabling expectation names each other's port.
func (l *lab) hostServersYAML(swapped bool) string {
	m := l.ms[0]
	p0, p1 := hostPort0, hostPort1
	if swapped {
		p0, p1 = p1, p0
	}
	s := fmt.Sprintf(`# The host lab: one production-grade VM.
servers:
  - name: %s
    zone: %s
    bootMAC: %q
    bootMode: uefi
    bmc:
      driver: redfish
      address: %q
      credentials: bmc-redfish
    want: deployed
    profile: %s
    nics:
      - {mac: %q, expect: {switch: %s, port: %s}}
      - {mac: %q, expect: {switch: %s, port: %s}}
`, m.name, m.zone, m.mac, m.addr, HostProfile, hostMAC0, hostSwitch, p0, hostMAC1, hostSwitch, p1)
	if hostAddressMode == "fixed" {
		s += fmt.Sprintf("    network:\n      addresses: {%s: [%s]}\n", hostBridge, hostAddr)
	}
	return s
}

// hostRepoFiles is the host lab's inventory.
func (l *lab) hostRepoFiles(mirror string) map[string]string {
	return map[string]string{
		"servers.yaml": l.hostServersYAML(true),
		"networks.yaml": fmt.Sprintf(`subnets:
  - name: %s
    cidr: %s
    gateway: %s
    vlan: %d
    mtu: 9000
    pools:
      - {start: %s, end: %s}
`, hostSubnet, hostCIDR, hostGateway, hostVLAN, hostPoolStart, hostPoolEnd),
		"profiles.yaml": `profiles:
  - name: ` + HostProfile + `
    image: ` + ImageName + `
    deploy: image
    attestation: required
    erase: zero
    eraseOverrides:
      - disks: {transport: nvme}
        method: secure
    sshKeys:
      - "` + l.sshPub + `"
    zone: lab
    min: {cores: 1, memoryGiB: 1, diskGiB: 2}
    count: 0
    network:
      ethernets:
        - {name: nic0, match: {name: "eth*"}}
        - {name: nic1, match: {name: "eth*"}}
      bonds:
        - {name: bond0, members: [nic0, nic1], mode: active-backup, miimon: 100, mtu: 9000}
      vlans:
        - {name: ` + hostVLANIf + `, link: bond0, id: ` + fmt.Sprint(hostVLAN) + `}
      bridges:
        - {name: ` + hostBridge + `, interfaces: [` + hostVLANIf + `], subnet: ` + hostSubnet + `, address: ` + hostAddressMode + `, defaultRoute: true}
    storage:
      root:
        raid: raid1
        disks: {transport: virtio}
      volumeGroups:
        - name: vg-data
          from: disks
          disks: {transport: nvme}
          volumes:
            - {name: data, size: rest, filesystem: ext4, mountPoint: /srv/data}
    join:
      site: vmlab
      tags: [vm, host]
`,
		"images.yaml": fmt.Sprintf("images:\n  - name: %s\n    url: %s/%s\n    checksumURL: %s/%s\n", ImageName, mirror, osimage.ImageFile, mirror, osimage.SumsFile),
		"README.md":   "# VM host lab inventory\n",
	}
}

// runHost is the host lab (Config.Host).
func (l *lab) runHost(ctx context.Context) error {
	for cmd, pkg := range map[string]string{"swtpm": "swtpm", "swtpm_setup": "swtpm-tools", "lldpd": "lldpd", "lldpcli": "lldpd", "bridge": "iproute2"} {
		if _, err := exec.LookPath(cmd); err != nil {
			return fmt.Errorf("%w: %s not in PATH (Debian package %s)", ErrPrereq, cmd, pkg)
		}
	}
	l.host = &hostLab{marker: "MACHINA-HOST-LAB-MARKER-" + randHex(16)}
	defer l.hostClose()
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
	l.step("setup: netns, VLAN 100 tagged on both ports with its gateway (MTU 9000), lldpd on both ports, swtpm, BMC, repository, controller", t0)
	m := l.ms[0]

	t0 = time.Now()
	if err := l.hostCabling(ctx); err != nil {
		return err
	}
	l.step("commission: LLDP neighbours of both NICs reported; cabling expectation swapped → CablingMismatch, not allocated; fixed in Git → cleared", t0)

	t0 = time.Now()
	if err := l.waitServers(ctx, HostMachine+" deployed", l.scale(10*time.Minute), func(ss []v1.Server) error {
		return l.lifecycles(ss, map[string]string{HostMachine: "deployed"}, false)
	}); err != nil {
		return err
	}
	l.step("deploy: RAID1 root across the two virtio disks, vg-data on the NVMe disk, image verified through the array, attested", t0)

	t0 = time.Now()
	note, err := l.hostFirstBoot(ctx, m)
	if err != nil {
		return err
	}
	l.step("first boot: "+note, t0)

	t0 = time.Now()
	if err := l.hostDegraded(ctx, m); err != nil {
		return err
	}
	l.step("degraded: powered off through the BMC, one root disk pulled, booted: RAID1 runs on one member, host heartbeats", t0)

	t0 = time.Now()
	note, err = l.hostRelease(ctx, m)
	if err != nil {
		return err
	}
	l.step("release with erase zero: "+note, t0)
	return nil
}

// hostCabling checks commissioning's LLDP and the cabling guard: both NICs
// heard their switch ports; with servers.yaml expecting them swapped the
// plan shows CablingMismatch and does not allocate; once servers.yaml
// expects what was heard the condition clears.
func (l *lab) hostCabling(ctx context.Context) error {
	if err := l.waitServers(ctx, HostMachine+" commissioned with LLDP", l.scale(8*time.Minute), func(ss []v1.Server) error {
		for _, s := range ss {
			if s.Name != HostMachine {
				continue
			}
			if s.Lifecycle == "failed" {
				return fmt.Errorf("%s failed: %s", s.Name, s.LastError)
			}
			if s.Hardware == nil {
				return fmt.Errorf("%s is %s, no hardware facts yet", s.Name, s.Lifecycle)
			}
			want := map[string]string{hostMAC0: hostPort0, hostMAC1: hostPort1}
			for _, n := range s.Hardware.NICs {
				p, ok := want[n.MAC]
				if !ok {
					continue
				}
				if n.LLDP == nil {
					return fmt.Errorf("%s NIC %s (%s): no LLDP", s.Name, n.Name, n.MAC)
				}
				if !strings.EqualFold(n.LLDP.SystemName, hostSwitch) || n.LLDP.PortID != p {
					return fmt.Errorf("vm lab: %s NIC %s heard %s port %s, want %s port %s", s.Name, n.MAC, n.LLDP.SystemName, n.LLDP.PortID, hostSwitch, p)
				}
				delete(want, n.MAC)
			}
			if len(want) > 0 {
				return fmt.Errorf("%s: NICs not reported with LLDP: %v", s.Name, want)
			}
			return nil
		}
		return errors.New(HostMachine + " not listed yet")
	}); err != nil {
		return err
	}
	cond := func() (*planCondition, error) {
		var plan struct {
			Conditions []planCondition `json:"conditions"`
		}
		if err := l.api.GetJSON(ctx, "/api/v1/plan", &plan); err != nil {
			return nil, err
		}
		for _, c := range plan.Conditions {
			if c.Subject == "server/"+HostMachine && c.Type == "CablingMismatch" {
				return &c, nil
			}
		}
		return nil, nil
	}
	if err := l.poll(ctx, "CablingMismatch for "+HostMachine, l.scale(2*time.Minute), func() error {
		c, err := cond()
		if err != nil {
			return err
		}
		if c == nil {
			return errors.New("no CablingMismatch condition")
		}
		for _, s := range []string{hostMAC0, hostMAC1, hostPort0, hostPort1} {
			if !strings.Contains(c.Message, s) {
				return fmt.Errorf("CablingMismatch %s/%s does not name %s: %s", c.Type, c.Reason, s, c.Message)
			}
		}
		l.log.Info("cabling guard", "condition", c.Type+"/"+c.Reason, "message", c.Message)
		return nil
	}); err != nil {
		return err
	}
	if err := l.waitStatus(ctx, gitops.ServerStatusPath(HostMachine), "CablingMismatch"); err != nil {
		return err
	}
	ss, err := l.listServers()
	if err != nil {
		return err
	}
	for _, s := range ss {
		if s.Name == HostMachine && (s.Lifecycle != "ready" || s.Allocation != nil) {
			return fmt.Errorf("vm lab: %s is %s (allocation %+v) under CablingMismatch, want ready and unallocated", s.Name, s.Lifecycle, s.Allocation)
		}
	}
	if err := l.push(ctx, HostMachine+": expect the cabling LLDP reported", func() error {
		return os.WriteFile(filepath.Join(l.clone, "servers.yaml"), []byte(l.hostServersYAML(false)), 0o644)
	}); err != nil {
		return err
	}
	return l.poll(ctx, "CablingMismatch cleared", l.scale(2*time.Minute), func() error {
		c, err := cond()
		if err != nil {
			return err
		}
		if c != nil {
			return fmt.Errorf("still %s/%s: %s", c.Type, c.Reason, c.Message)
		}
		return nil
	})
}

// poll runs f every second until it returns nil or d passes.
func (l *lab) poll(ctx context.Context, what string, d time.Duration, f func() error) error {
	deadline := time.Now().Add(d)
	for {
		err := f()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("vm lab: %s: not within %s: %w", what, d, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// hostScript prints what the first-boot check reads, section by section.
const hostScript = `set -u
echo "== link"; ip -o -d link show
echo "== addr"; ip -o -4 addr show
echo "== mdstat"; cat /proc/mdstat
echo "== root"; findmnt -n -o SOURCE /
echo "== data"; findmnt -n -o SOURCE,FSTYPE /srv/data
echo "== pvs"; pvs --noheadings -o pv_name,vg_name 2>&1
echo "== lsblk"; lsblk -n -o NAME,TYPE,SIZE,FSTYPE,MOUNTPOINT
echo "== gateway"; head -c 1048576 /dev/zero | curl -s -m 60 -o /dev/null -w '%{http_code} %{size_download}\n' --data-binary @- GATEWAY
echo "== end"
`

// sections splits hostScript's output into its "== name" sections.
func sections(out string) map[string]string {
	sec := map[string]string{}
	cur := ""
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "== ") {
			cur = strings.TrimPrefix(line, "== ")
			continue
		}
		sec[cur] += line + "\n"
	}
	return sec
}

var linkName = regexp.MustCompile(`^\d+: ([^:@]+)(@[^:]+)?:`)

// hostFirstBoot waits for vm-host's join, checks it arrived from the
// host's address on the VLAN, logs in over SSH and checks the network,
// storage and attestation against the declaration, and writes the marker
// the erase must remove.
func (l *lab) hostFirstBoot(ctx context.Context, m *machine) (string, error) {
	if err := l.poll(ctx, HostMachine+" joined", l.scale(8*time.Minute), func() error {
		c, cancel := context.WithTimeout(ctx, 20*time.Second)
		hs, err := l.api.Hosts(c)
		cancel()
		if err != nil {
			return err
		}
		for _, h := range hs.Items {
			if h.Server == HostMachine && h.JoinStatus == "joined" && h.Online {
				return nil
			}
		}
		return fmt.Errorf("%+v", hs.Items)
	}); err != nil {
		// The host may be up on its VLAN without reaching the controller
		// (a missing route): say what it has.
		if hostAddressMode == "fixed" {
			c, cancel := context.WithTimeout(ctx, time.Minute)
			out, serr := l.ssh(c, hostAddr, "", "ip -4 route; ip -o -4 addr")
			cancel()
			err = fmt.Errorf("%w; the host over SSH at %s: %v %s", err, hostAddr, serr, out)
		}
		return "", err
	}
	addr, err := l.hostJoinAddr()
	if err != nil {
		return "", err
	}
	l.host.addr = addr
	var out string
	if err := l.poll(ctx, "SSH to "+addr, l.scale(3*time.Minute), func() error {
		c, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		out, err = l.ssh(c, addr, strings.ReplaceAll(hostScript, "GATEWAY", l.host.gwURL), "sudo", "sh", "-s")
		if err != nil {
			return fmt.Errorf("%w: %s", err, out)
		}
		return nil
	}); err != nil {
		return "", err
	}
	l.log.Info("host state", "vm", HostMachine, "out", out)
	sec := sections(out)
	links := map[string]string{}
	for _, line := range strings.Split(sec["link"], "\n") {
		if mm := linkName.FindStringSubmatch(line); mm != nil {
			links[mm[1]] = line
		}
	}
	checks := []struct{ ifname, want string }{
		{"nic0", "master bond0"}, {"nic1", "master bond0"}, {"nic0", hostMAC0}, {"nic1", hostMAC1},
		{"bond0", "bond mode active-backup"}, {"bond0", "mtu 9000"},
		{hostVLANIf, fmt.Sprintf("vlan protocol 802.1Q id %d", hostVLAN)}, {hostVLANIf, "master " + hostBridge}, {hostVLANIf, "mtu 9000"},
		{hostBridge, "bridge "}, {hostBridge, "mtu 9000"},
	}
	for _, c := range checks {
		if !strings.Contains(links[c.ifname], c.want) {
			return "", fmt.Errorf("vm lab: %s: ip -d link of %s lacks %q: %q", HostMachine, c.ifname, c.want, links[c.ifname])
		}
	}
	if !strings.Contains(sec["addr"], hostBridge+"    inet "+addr+"/24") && !regexp.MustCompile(regexp.QuoteMeta(hostBridge)+`\s+inet `+regexp.QuoteMeta(addr)+`/24`).MatchString(sec["addr"]) {
		return "", fmt.Errorf("vm lab: %s: %s has not %s/24: %s", HostMachine, hostBridge, addr, sec["addr"])
	}
	// The gateway over the VLAN: 1 MiB up, 4 MiB down over HTTP to the
	// gateway's own address; with MTU 9000 end to end the TCP segments
	// fill 9000-byte packets in both directions, which the gateway saw.
	if strings.TrimSpace(sec["gateway"]) != fmt.Sprintf("200 %d", gatewayReply) {
		return "", fmt.Errorf("vm lab: %s: HTTP to the gateway %s over VLAN %d: %q", HostMachine, l.host.gwURL, hostVLAN, sec["gateway"])
	}
	up, down := l.host.gw.maxFrames()
	if up < 9014 || down < 9014 {
		return "", fmt.Errorf("vm lab: %s: largest frames on VLAN %d: %d bytes from the host, %d to it; want 9014 (MTU 9000) both ways", HostMachine, hostVLAN, up, down)
	}
	md := sec["mdstat"]
	if !regexp.MustCompile(`active raid1 vd[a-z]\[\d\] vd[a-z]\[\d\]`).MatchString(md) || !strings.Contains(md, "[2/2] [UU]") {
		return "", fmt.Errorf("vm lab: %s: /proc/mdstat shows no 2-disk RAID1 of the virtio disks: %s", HostMachine, md)
	}
	if root := strings.TrimSpace(sec["root"]); !strings.HasPrefix(root, "/dev/md") {
		return "", fmt.Errorf("vm lab: %s: root is mounted from %q, not the array", HostMachine, root)
	}
	if data := strings.Fields(sec["data"]); len(data) != 2 || data[0] != "/dev/mapper/vg--data-data" || data[1] != "ext4" {
		return "", fmt.Errorf("vm lab: %s: /srv/data is %q, want /dev/mapper/vg--data-data ext4", HostMachine, sec["data"])
	}
	if pv := strings.Fields(sec["pvs"]); len(pv) != 2 || !strings.HasPrefix(pv[0], "/dev/nvme") || pv[1] != "vg-data" {
		return "", fmt.Errorf("vm lab: %s: pvs %q, want vg-data on the NVMe disk", HostMachine, sec["pvs"])
	}
	// Attestation: the TPM was enrolled and every release (report, plan,
	// done) came after a verified quote.
	verified, err := l.countLog(`msg="attestation verified"`, "machine="+HostMachine)
	if err != nil {
		return "", err
	}
	if verified < 3 {
		return "", fmt.Errorf("vm lab: %s: %d verified attestations in the controller log, want at least 3 (commissioning report, deploy plan, done)", HostMachine, verified)
	}
	evs, err := l.api.ServerEvents(ctx, HostMachine, 0, 500)
	if err != nil {
		return "", err
	}
	enrolled := ""
	for _, e := range evs.Events {
		if e.Kind == "tpm.enrolled" {
			enrolled = e.Message
		}
	}
	if enrolled == "" {
		return "", fmt.Errorf("vm lab: %s: no tpm.enrolled event", HostMachine)
	}
	if err := l.waitStatus(ctx, gitops.ServerStatusPath(HostMachine), `ek: "sha256:`); err != nil {
		return "", err
	}
	// The marker, padded to whole blocks, on the root array and on the
	// data volume; it must be on the disk images now (positive control of
	// the erase check).
	write := fmt.Sprintf(`set -e
for f in /var/lib/machina-lab-marker /srv/data/machina-lab-marker; do
  i=0; while [ $i -lt 256 ]; do printf '%%s\n' %s; i=$((i+1)); done > "$f"
done
sync`, l.host.marker)
	if o, err := l.ssh(ctx, addr, write, "sudo", "sh", "-s"); err != nil {
		return "", fmt.Errorf("vm lab: %s: write marker: %w: %s", HostMachine, err, o)
	}
	if err := l.poll(ctx, "marker on every disk image", l.scale(time.Minute), func() error {
		for _, d := range l.host.hostDisks() {
			st, err := scanDisk(d, []byte(l.host.marker))
			if err != nil {
				return err
			}
			if !st.marker {
				return fmt.Errorf("%s: marker not found (%d data bytes)", filepath.Base(d), st.data)
			}
		}
		return nil
	}); err != nil {
		return "", err
	}
	return fmt.Sprintf("joined from %s (%s) over VLAN %d; bond0 active-backup of nic0+nic1, %s on bond0, bridge %s, MTU 9000 (HTTP to the gateway %s: %d-byte frames both ways), RAID1 [UU] root on the array, vg-data on NVMe; %d verified attestations, %s; marker on all three disk images",
		addr, hostAddressMode, hostVLAN, hostVLANIf, hostBridge, hostGateway, up, verified, enrolled), nil
}

// hostJoinAddr is the address vm-host's join came from (the controller
// log's "host joined" line): hostAddr in fixed mode, an address of the
// pool in pool mode.
func (l *lab) hostJoinAddr() (string, error) {
	b, err := os.ReadFile(filepath.Join(l.dir, "controller.log"))
	if err != nil {
		return "", err
	}
	re := regexp.MustCompile(`remote=([0-9.]+):\d+`)
	var seen []string
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.Contains(line, `msg="host joined"`) {
			continue
		}
		mm := re.FindStringSubmatch(line)
		if mm == nil {
			continue
		}
		seen = append(seen, mm[1])
		a, err := netip.ParseAddr(mm[1])
		if err != nil {
			continue
		}
		switch hostAddressMode {
		case "fixed":
			if mm[1] == hostAddr {
				return mm[1], nil
			}
		case "pool":
			if a.Compare(netip.MustParseAddr(hostPoolStart)) >= 0 && a.Compare(netip.MustParseAddr(hostPoolEnd)) <= 0 {
				return mm[1], nil
			}
		}
	}
	return "", fmt.Errorf("vm lab: %s's join came from %v, not its %s address on %s", HostMachine, seen, hostAddressMode, hostSubnet)
}

// countLog counts the controller log's lines that hold every one of subs.
func (l *lab) countLog(subs ...string) (int, error) {
	b, err := os.ReadFile(filepath.Join(l.dir, "controller.log"))
	if err != nil {
		return 0, err
	}
	n := 0
	for _, line := range strings.Split(string(b), "\n") {
		ok := true
		for _, s := range subs {
			ok = ok && strings.Contains(line, s)
		}
		if ok {
			n++
		}
	}
	return n, nil
}

// bmcReset posts a ComputerSystem.Reset to m's Redfish BMC.
func (l *lab) bmcReset(ctx context.Context, m *machine, resetType string) error {
	get := func(path string, v any) error {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, m.addr+path, nil)
		req.SetBasicAuth("admin", l.bmcPass)
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
	var systems struct {
		Members []struct {
			ID string `json:"@odata.id"`
		} `json:"Members"`
	}
	if err := get("/redfish/v1/Systems", &systems); err != nil || len(systems.Members) == 0 {
		return fmt.Errorf("vm lab: %s BMC systems: %v (%d)", m.name, err, len(systems.Members))
	}
	body, _ := json.Marshal(map[string]string{"ResetType": resetType})
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, m.addr+systems.Members[0].ID+"/Actions/ComputerSystem.Reset", bytes.NewReader(body))
	req.SetBasicAuth("admin", l.bmcPass)
	req.Header.Set("Content-Type", "application/json")
	resp, err := l.hc.Do(req)
	if err != nil {
		return fmt.Errorf("vm lab: %s BMC reset %s: %w", m.name, resetType, err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("vm lab: %s BMC reset %s: %s: %s", m.name, resetType, resp.Status, b)
	}
	return nil
}

// hostDegraded powers vm-host off through its BMC, pulls the second root
// disk, powers it on and checks that it boots on one RAID1 member and
// heartbeats; then puts the disk back (used at the next power-on).
func (l *lab) hostDegraded(ctx context.Context, m *machine) error {
	var bootedBefore time.Time
	if hs, err := l.api.Hosts(ctx); err == nil {
		for _, h := range hs.Items {
			if h.Server == HostMachine {
				bootedBefore = h.BootedAt
			}
		}
	}
	if err := m.vm.SetExtraArgs(l.host.hostDevices(false)); err != nil {
		return err
	}
	if err := l.bmcReset(ctx, m, "ForceOff"); err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	err := m.vm.WaitOff(wctx)
	cancel()
	if err != nil {
		return fmt.Errorf("vm lab: %s still on after ForceOff: %w", m.name, err)
	}
	if err := l.bmcReset(ctx, m, "On"); err != nil {
		return err
	}
	if err := l.poll(ctx, HostMachine+" heartbeating after the degraded boot", l.scale(6*time.Minute), func() error {
		c, cancel := context.WithTimeout(ctx, 20*time.Second)
		hs, err := l.api.Hosts(c)
		cancel()
		if err != nil {
			return err
		}
		for _, h := range hs.Items {
			if h.Server == HostMachine {
				if h.Online && h.BootedAt.After(bootedBefore) {
					return nil
				}
				return fmt.Errorf("online=%v bootedAt=%s (before %s)", h.Online, h.BootedAt, bootedBefore)
			}
		}
		return errors.New("no host")
	}); err != nil {
		return err
	}
	// The node agent heartbeats as soon as its unit starts, which can be
	// before sshd listens (both start after network-online): ask until
	// sshd answers.
	var out string
	if err := l.poll(ctx, HostMachine+" answering ssh after the degraded boot", l.scale(2*time.Minute), func() error {
		c, cancel := context.WithTimeout(ctx, 40*time.Second)
		defer cancel()
		var err error
		if out, err = l.ssh(c, l.host.addr, "cat /proc/mdstat; echo '== root'; findmnt -n -o SOURCE /\n", "sudo", "sh", "-s"); err != nil {
			return fmt.Errorf("ssh: %w: %s", err, out)
		}
		return nil
	}); err != nil {
		return fmt.Errorf("vm lab: %s degraded: %w", HostMachine, err)
	}
	l.log.Info("degraded host", "out", out)
	if !strings.Contains(out, "[2/1]") || !(strings.Contains(out, "[U_]") || strings.Contains(out, "[_U]")) {
		return fmt.Errorf("vm lab: %s: mdstat after pulling a disk is not a degraded 2-disk RAID1: %s", HostMachine, out)
	}
	if !strings.Contains(out, "== root\n/dev/md") {
		return fmt.Errorf("vm lab: %s: degraded root not on the array: %s", HostMachine, out)
	}
	return m.vm.SetExtraArgs(l.host.hostDevices(true))
}

// hostRelease releases vm-host (want ready) and checks the erase the
// profile chose per disk (erase: zero, secure for the NVMe disk): the
// wipe's outcome names the two virtio disks erased with zero and the NVMe
// disk with NVMe Format (user data erase), each with verified samples,
// the VM is off, and every disk image file reads back as zeros only, so
// neither the image nor the marker is left.
func (l *lab) hostRelease(ctx context.Context, m *machine) (string, error) {
	// Off first, so the release's network boot starts qemu with both
	// root disks again.
	if err := l.bmcReset(ctx, m, "ForceOff"); err != nil {
		return "", err
	}
	if err := l.push(ctx, "release "+HostMachine, func() error {
		return replaceFile(filepath.Join(l.clone, "servers.yaml"), "    want: deployed\n", "    want: ready\n")
	}); err != nil {
		return "", err
	}
	approved := false
	var erased []v1.DiskErase
	if err := l.poll(ctx, HostMachine+" released and erased", l.scale(8*time.Minute), func() error {
		if !approved {
			var plan struct {
				Held []json.RawMessage `json:"held"`
			}
			if err := l.api.GetJSON(ctx, "/api/v1/plan", &plan); err == nil && len(plan.Held) > 0 {
				var inv struct{ Good struct{ Digest string } }
				if err := l.api.GetJSON(ctx, "/api/v1/inventory", &inv); err == nil {
					if _, err := l.api.Approve(ctx, inv.Good.Digest); err == nil {
						approved = true
						l.log.Info("approved the braked release", "digest", inv.Good.Digest)
					}
				}
			}
		}
		ss, err := l.listServers()
		if err != nil {
			return err
		}
		for _, s := range ss {
			if s.Name != HostMachine {
				continue
			}
			if s.Lifecycle == "failed" {
				return fmt.Errorf("vm lab: %s failed: %s", s.Name, s.LastError)
			}
			if s.Lifecycle != "ready" || s.NeedsWipe || len(s.LastErase) == 0 {
				return fmt.Errorf("%s: %s needsWipe=%v lastErase=%d (%s)", s.Name, s.Lifecycle, s.NeedsWipe, len(s.LastErase), s.LastError)
			}
			erased = s.LastErase
			return nil
		}
		return errors.New("not listed")
	}); err != nil {
		return "", err
	}
	if len(erased) != 3 {
		return "", fmt.Errorf("vm lab: %s: erase outcome for %d disks, want 3: %+v", HostMachine, len(erased), erased)
	}
	var parts []string
	zeroed, secured := 0, 0
	for _, e := range erased {
		want := "zero"
		if strings.HasPrefix(e.Name, "nvme") {
			want = "nvme-format-user-data-erase"
		}
		if e.Method != want || e.VerifiedSamples == 0 {
			return "", fmt.Errorf("vm lab: %s: disk %s (%s) erased with %q, %d samples verified; want %s, verified", HostMachine, e.Name, e.Disk, e.Method, e.VerifiedSamples, want)
		}
		if want == "zero" {
			zeroed++
		} else {
			secured++
		}
		parts = append(parts, fmt.Sprintf("%s %s %d MiB in %s (%d samples)", e.Name, e.Method, e.Bytes>>20, e.Duration.Round(100*time.Millisecond), e.VerifiedSamples))
	}
	if zeroed != 2 || secured != 1 {
		return "", fmt.Errorf("vm lab: %s: %d disks zeroed and %d NVMe formatted, want 2 and 1: %+v", HostMachine, zeroed, secured, erased)
	}
	wctx, cancel := context.WithTimeout(ctx, l.scale(2*time.Minute))
	err := m.vm.WaitOff(wctx)
	cancel()
	if err != nil {
		return "", fmt.Errorf("vm lab: %s still on after the release wipe: %w", m.name, err)
	}
	var scanned []string
	for _, d := range l.host.hostDisks() {
		st, err := scanDisk(d, []byte(l.host.marker))
		if err != nil {
			return "", err
		}
		if st.marker || st.nonZero != 0 {
			return "", fmt.Errorf("vm lab: %s after the erase: marker found %v, %d non-zero bytes (first at %d)", filepath.Base(d), st.marker, st.nonZero, st.firstNonZero)
		}
		scanned = append(scanned, fmt.Sprintf("%s %d MiB allocated, all zero", filepath.Base(d), st.data>>20))
	}
	return "per disk (zero, secure on NVMe) erased " + strings.Join(parts, ", ") + "; VM off; images read back: " + strings.Join(scanned, ", "), nil
}

// diskScan is what scanDisk found in a disk image file.
type diskScan struct {
	// data is the bytes in allocated extents (holes read as zeros and are
	// skipped); nonZero how many of them are not zero, firstNonZero the
	// offset of the first.
	data, nonZero, firstNonZero int64
	// marker: the marker occurs in the file.
	marker bool
}

// scanDisk reads the allocated extents of the sparse file path
// (SEEK_DATA/SEEK_HOLE) and counts non-zero bytes and looks for marker.
func scanDisk(path string, marker []byte) (diskScan, error) {
	var st diskScan
	f, err := os.Open(path)
	if err != nil {
		return st, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return st, err
	}
	size := fi.Size()
	buf := make([]byte, 4<<20)
	tail := []byte{}
	st.firstNonZero = -1
	for off := int64(0); off < size; {
		data, err := unix.Seek(int(f.Fd()), off, unix.SEEK_DATA)
		if err != nil {
			break // ENXIO: no data after off
		}
		hole, err := unix.Seek(int(f.Fd()), data, unix.SEEK_HOLE)
		if err != nil {
			return st, fmt.Errorf("scan %s: %w", path, err)
		}
		for pos := data; pos < hole; {
			n := min(int64(len(buf)), hole-pos)
			k, err := f.ReadAt(buf[:n], pos)
			if err != nil && !errors.Is(err, io.EOF) {
				return st, fmt.Errorf("scan %s: %w", path, err)
			}
			chunk := buf[:k]
			st.data += int64(k)
			for i, b := range chunk {
				if b != 0 {
					if st.firstNonZero < 0 {
						st.firstNonZero = pos + int64(i)
					}
					st.nonZero++
				}
			}
			if !st.marker && bytes.Contains(append(tail, chunk...), marker) {
				st.marker = true
			}
			if len(chunk) >= len(marker) {
				tail = append(tail[:0], chunk[len(chunk)-len(marker)+1:]...)
			}
			pos += int64(k)
			if k == 0 {
				break
			}
		}
		off = hole
	}
	return st, nil
}
