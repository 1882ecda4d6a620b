// Package sim is the simulated lab: N simulated servers, each behind a
// bmcsim Redfish BMC serving a real vendor tree (or, for the inventory's
// IPMI servers when it is installed, OpenIPMI's ipmi_sim, whose
// Serial-over-LAN is the machine's serial console), with a simulated machine
// that PXE-boots through the controller's real HTTP boot endpoints with real
// tokens and runs the real agent code (ramdisk/agent) against generated
// hardware and sparse disk files. It also lays out the inventory repository
// (a bare repository plus a working clone, as an operator has) and a local
// image mirror, so the controller runs exactly as in production, on
// loopback only.
//
// It is the embedded default behind `machina sim` and `make demo`, the
// harness of the end-to-end tests, and the load generator of bench/scale.
package sim

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-git/go-git/v5"
	gitconfig "github.com/go-git/go-git/v5/config"
	"github.com/go-git/go-git/v5/plumbing/object"

	"github.com/machina-metal/machina/bmc/bmcsim"
	"github.com/machina-metal/machina/bmc/ipmi/ipmisim"
	"github.com/machina-metal/machina/inventory"
)

// Config configures a Lab. Zero values are usable except Dir.
type Config struct {
	// Dir is the lab's folder: repo.git (bare), inventory (working clone),
	// mirror, machines. Required; created if missing. Start rebuilds the
	// lab from scratch: it removes those four subfolders left by an
	// earlier lab in Dir (and nothing else in Dir) before writing them.
	Dir string
	// MachinesDir, when set, holds the machines folder instead of Dir:
	// each machine's simulated /proc and /sys tree, disk files (sparse,
	// with the images written to them), BMC and node-agent state. Start
	// removes an earlier lab's MachinesDir/machines (and nothing else in
	// MachinesDir). bench/scale points it at a tmpfs (/dev/shm) while Dir
	// stays on disk: 10,000 machines' trees and 1,000 deployed images on
	// the disk's file system cost the lab's process about ten times the
	// CPU of tmpfs to write (BenchmarkMachineDisk) and the kernel the
	// writeback of every image. Empty: Dir.
	MachinesDir string
	// Inventory is the example site to simulate; nil means the embedded
	// inventory-example (12 servers). Ignored when Servers is set.
	Inventory fs.FS
	// Servers, when > 0, generates a site of that many servers in three
	// zones instead (scale runs), with profile counts of 10% of them.
	Servers int
	// BootDelay is the simulated firmware time before each network boot;
	// zero boots at once (tests, scale runs).
	BootDelay time.Duration
	// PowerOffHold bounds how long a machine powered on (or reset)
	// through its BMC keeps a power-off it makes itself (its agent's,
	// after commissioning or a wipe) waiting for the BMC to read it on,
	// as the BMC always does on a real machine, which is on for minutes
	// (Machine.powerOffFrom); zero means DefaultPowerOffHold (10 s),
	// negative turns the wait off (the machine powers off at once, even
	// before the BMC's power wait has read it on).
	PowerOffHold time.Duration
	// ImageBytes is the size of the simulated OS image; zero means 4 MiB.
	ImageBytes int
	// Credentials is the BMC account every simulated BMC accepts; zero
	// means admin / "sim-password".
	Username, Password string
	// RedfishOnly gives every server a bmcsim Redfish BMC, IPMI ones too
	// (tests that read BMC requests); by default servers whose inventory
	// says ipmi get OpenIPMI's ipmi_sim when it is installed.
	RedfishOnly bool
	// MachineArch sets the architecture of simulated machines by server
	// name ("arm64" or "amd64"), whatever servers.yaml states, so a test can
	// have a machine whose arch is unstated or stated wrongly. Zero: the
	// servers.yaml arch, else amd64.
	MachineArch map[string]string
	// BMCQuirks, when set, edits the quirks of server's bmcsim BMC,
	// starting from bmcsim.DefaultQuirks of its tree's manufacturer (tree
	// is the fixture folder it serves), to put a server behind a BMC mode
	// (Basic only, Once coerced, ...). Nil keeps the defaults.
	BMCQuirks func(server, tree string, q *bmcsim.Quirks)
	// SharedChassis serves every Redfish BMC's tree with a second system
	// in the first system's chassis (bmcsim.WriteSharedChassisTree), and
	// servers.yaml names the first system (bmc.systemID).
	SharedChassis bool
	// BMCTLS, when set, serves the Redfish BMCs over HTTPS with it (a
	// certificate from the test's CA); CABundle is then written as every
	// Redfish server's bmc.caBundle (the secret holding that CA).
	BMCTLS   *tls.Config
	CABundle string
	// PowerTransition is every bmcsim BMC's bmcsim.Config.PowerTransition:
	// after a reset PowerState reads PoweringOn or PoweringOff for this
	// long (as iDRAC, iLO and bmcweb do while the host powers up or
	// down), or the old state with PowerTransitionKeepsState. Zero: power
	// changes show at once.
	PowerTransition           time.Duration
	PowerTransitionKeepsState bool
	// Logger: nil discards.
	Logger *slog.Logger
}

// Lab is a running simulated lab.
type Lab struct {
	cfg      Config
	ctx      context.Context
	cancel   context.CancelFunc
	log      *slog.Logger
	http     *http.Client
	machines map[string]*Machine
	bmcs     map[string]*bmcsim.Server
	servers  []*http.Server
	ipmiSims []*ipmisim.Sim
	wg       sync.WaitGroup

	// runs counts the machines' boot goroutines; Close waits for them, so
	// none logs after the lab (and a test's logger) is gone. closing, set
	// under runMu, stops new ones starting once Close has begun.
	runMu   sync.Mutex
	closing bool
	runs    sync.WaitGroup
	// imageBytes counts the controller's image bytes the ramdisks read
	// (ImageBytesFromController).
	imageBytes atomic.Int64

	// RepoURL is the bare inventory repository (file URL) the controller polls.
	RepoURL string
	// Clone is the operator's working clone: edit, commit, push.
	Clone string
	// MirrorURL serves the simulated images and their SHA256SUMS.
	MirrorURL string

	// fallbacks are the servers the inventory gives an IPMI BMC that run
	// a bmcsim Redfish BMC here, with why (RedfishOnly, ipmi_sim missing).
	fallbacks map[string]string

	mu   sync.Mutex
	ctrl string
}

// Start lays out the lab and starts its BMCs and mirror on 127.0.0.1. The
// machines stay powered off until the controller acts through the BMCs.
// Call SetController with the controller's URL before they boot, and
// Close when done.
func Start(ctx context.Context, cfg Config) (*Lab, error) {
	if cfg.Dir == "" {
		return nil, errors.New("sim: Config.Dir is required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.ImageBytes <= 0 {
		cfg.ImageBytes = 4 << 20
	}
	if cfg.Username == "" {
		cfg.Username, cfg.Password = "admin", "sim-password"
	}
	ctx, cancel := context.WithCancel(ctx)
	l := &Lab{cfg: cfg, ctx: ctx, cancel: cancel, log: cfg.Logger, machines: map[string]*Machine{}, bmcs: map[string]*bmcsim.Server{}, fallbacks: map[string]string{},
		http: &http.Client{Timeout: 5 * time.Minute, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}}
	if err := l.start(); err != nil {
		l.Close()
		return nil, err
	}
	return l, nil
}

// labSubdirs are the folders Start generates in Config.Dir besides the
// machines folder (Lab.machinesDir, which may be elsewhere); an earlier
// lab's are removed first (their symlinked sysfs trees and disk files
// cannot be written over).
var labSubdirs = []string{"repo.git", "inventory", "mirror", "bmc-trees"}

func (l *Lab) start() error {
	if err := os.MkdirAll(l.cfg.Dir, 0o755); err != nil {
		return err
	}
	for _, sub := range labSubdirs {
		if err := os.RemoveAll(filepath.Join(l.cfg.Dir, sub)); err != nil {
			return fmt.Errorf("sim: remove the earlier lab's %s: %w", sub, err)
		}
	}
	if err := os.RemoveAll(l.machinesDir()); err != nil {
		return fmt.Errorf("sim: remove the earlier lab's machines: %w", err)
	}
	site, err := l.site()
	if err != nil {
		return err
	}
	mirror, err := l.startMirror(site)
	if err != nil {
		return err
	}
	l.MirrorURL = mirror

	fixtures, err := bmcsim.FixturesDir()
	if err != nil {
		return fmt.Errorf("sim: redfish fixtures: %w", err)
	}
	var trees bmcsim.Trees
	addrs := map[string]string{}
	bmcExtra := map[string][]string{} // more lines of a server's bmc block
	for i := range site.Servers {
		if err := l.ctx.Err(); err != nil {
			// Start's context ended while machines were being set up (a
			// bench stopped by a signal): write no more of them.
			return fmt.Errorf("sim: start: %w", err)
		}
		s := &site.Servers[i]
		treeName := simTrees[i%len(simTrees)]
		if s.BootMode == inventory.BootBIOS && treeName == "hpe-proliant-dl385gen10plusv2-ilo5" {
			// iLO 5 refuses a boot mode in a PATCH: a legacy-BIOS server
			// cannot be switched from the tree's UEFI mode over Redfish.
			treeName = simTrees[(i+1)%len(simTrees)]
		}
		dir, err := bmcsim.TreeDir(fixtures, treeName)
		if err != nil {
			return err
		}
		if l.cfg.SharedChassis && !(s.BMC.Driver == inventory.DriverIPMI && !l.cfg.RedfishOnly && IPMIAvailable()) {
			shared := filepath.Join(l.cfg.Dir, "bmc-trees", treeName)
			if _, err := os.Stat(shared); err != nil {
				if err := bmcsim.WriteSharedChassisTree(dir, shared); err != nil {
					return fmt.Errorf("sim: %s BMC: %w", s.Name, err)
				}
			}
			dir = shared
			tr, err := trees.Load(dir)
			if err != nil {
				return fmt.Errorf("sim: %s BMC: %w", s.Name, err)
			}
			bmcExtra[s.Name] = append(bmcExtra[s.Name], "systemID: "+q(tr.SystemIDs()[0]))
		}
		hw := hardwareFor(s.Zone, i)
		if hw.Arch = s.Arch; l.cfg.MachineArch[s.Name] != "" {
			hw.Arch = l.cfg.MachineArch[s.Name]
		}
		m := &Machine{Name: s.Name, MAC: s.BootMAC, HW: hw, lab: l, phase: PhaseOff, src: srcAddr(i),
			root: filepath.Join(l.machinesDir(), s.Name, "root"), devDir: filepath.Join(l.machinesDir(), s.Name, "dev"),
			log: l.log.With("sim", s.Name)}
		m.agentHTTP = &http.Client{Timeout: 5 * time.Minute, Transport: planCapture{base: l.http.Transport, m: m}}
		if err := m.HW.writeTree(m.root, m.devDir, m.MAC); err != nil {
			return fmt.Errorf("sim: %s hardware: %w", s.Name, err)
		}
		if s.BMC.Driver == inventory.DriverIPMI {
			switch {
			case l.cfg.RedfishOnly:
				l.fallbacks[s.Name] = "the lab runs Redfish BMCs only (sim.Config.RedfishOnly)"
			case !IPMIAvailable():
				l.fallbacks[s.Name] = IPMIMissing
			}
		}
		if s.BMC.Driver == inventory.DriverIPMI && l.fallbacks[s.Name] == "" {
			addr, err := l.startIPMI(m)
			if err != nil {
				return fmt.Errorf("sim: %s IPMI BMC: %w", s.Name, err)
			}
			l.machines[s.Name] = m
			addrs[s.Name] = addr
			continue
		}
		bcfg := bmcsim.Config{Username: l.cfg.Username, Password: l.cfg.Password, Power: m, SessionTimeout: -1,
			PowerTransition: l.cfg.PowerTransition, PowerTransitionKeepsState: l.cfg.PowerTransitionKeepsState,
			Firmware: bmcsim.Firmware{FetchImages: true}}
		if l.cfg.BMCQuirks != nil {
			tr, err := trees.Load(dir)
			if err != nil {
				return fmt.Errorf("sim: %s BMC: %w", s.Name, err)
			}
			q := bmcsim.DefaultQuirks(tr.Manufacturer)
			l.cfg.BMCQuirks(s.Name, treeName, &q)
			bcfg.Quirks = &q
		}
		srv, err := trees.New(dir, bcfg)
		if err != nil {
			return fmt.Errorf("sim: %s BMC: %w", s.Name, err)
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		hs := &http.Server{Handler: srv, ReadHeaderTimeout: 10 * time.Second}
		l.servers = append(l.servers, hs)
		scheme := "http://"
		if l.cfg.BMCTLS != nil {
			ln = tls.NewListener(ln, l.cfg.BMCTLS)
			scheme = "https://"
			if l.cfg.CABundle != "" {
				bmcExtra[s.Name] = append(bmcExtra[s.Name], "caBundle: "+l.cfg.CABundle)
			}
		}
		l.wg.Add(1)
		go func() { defer l.wg.Done(); _ = hs.Serve(ln) }()
		l.machines[s.Name], l.bmcs[s.Name] = m, srv
		addrs[s.Name] = scheme + ln.Addr().String()
	}
	return l.writeRepo(site, addrs, bmcExtra)
}

// machinesDir is the folder of the machines' folders: "machines" in
// Config.MachinesDir, else in Config.Dir.
func (l *Lab) machinesDir() string {
	if l.cfg.MachinesDir != "" {
		return filepath.Join(l.cfg.MachinesDir, "machines")
	}
	return filepath.Join(l.cfg.Dir, "machines")
}

// simTrees are the vendor trees the simulated BMCs serve, round robin.
var simTrees = []string{"dell-poweredge-r750-idrac9", "hpe-proliant-dl385gen10plusv2-ilo5", "lenovo-thinksystem-sr670v2-xcc",
	"supermicro-sys821ge-tnhr-x13", "dmtf-public-rackmount1", "openbmc-bmcweb-stock"}

// site returns the inventory to simulate.
func (l *Lab) site() (*inventory.Inventory, error) {
	if l.cfg.Servers > 0 {
		return generated(l.cfg.Servers), nil
	}
	fsys := l.cfg.Inventory
	if fsys == nil {
		fsys = exampleFS
	}
	res, err := inventory.Load(fsys, inventory.Limits{})
	if err != nil {
		return nil, fmt.Errorf("sim: example inventory: %w", err)
	}
	return res.Inventory, nil
}

// generated makes a site of n servers in three zones with the example's
// profiles, each keeping 10% of its zone deployed.
func generated(n int) *inventory.Inventory {
	inv := &inventory.Inventory{}
	zones := []string{"zone-a", "zone-b", "zone-c"}
	for i := 0; i < n; i++ {
		inv.Servers = append(inv.Servers, inventory.Server{Name: fmt.Sprintf("s%05d", i), Zone: zones[i%3], Site: "sim", Rack: fmt.Sprintf("r%d", i/40),
			BootMAC: fmt.Sprintf("52:54:%02x:%02x:%02x:%02x", (i>>24)&0xff, (i>>16)&0xff, (i>>8)&0xff, i&0xff), BootMode: inventory.BootUEFI,
			BMC: inventory.BMC{Driver: inventory.DriverRedfish, Credentials: "bmc-redfish"}, Want: inventory.WantReady})
	}
	per := max(n/30, 1) // 10% of each zone
	inv.Profiles = []inventory.Profile{
		{Name: "hypervisor", Image: "ubuntu-24.04", Zone: "zone-a", Count: per, Min: inventory.Min{Cores: 8, MemoryGiB: 32, DiskGiB: 100}, SSHKeys: []string{simKey}},
		{Name: "storage", Image: "debian-12", Zone: "zone-b", Count: per, Min: inventory.Min{Cores: 8, MemoryGiB: 64, DiskGiB: 200}, SSHKeys: []string{simKey}},
		{Name: "gpu", Image: "rocky-9", Zone: "zone-c", Count: per, Min: inventory.Min{Cores: 16, MemoryGiB: 128, DiskGiB: 400}, SSHKeys: []string{simKey}},
	}
	inv.Images = []inventory.Image{{Name: "ubuntu-24.04"}, {Name: "debian-12"}, {Name: "rocky-9"}}
	return inv
}

const simKey = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIO4VqFGm2ahY3KSc9k9lrQMD0j2/tR46oEgCPUxiE9s7 ops@lab1"

// startMirror serves one copy of the simulated OS image per image name, and
// a SHA256SUMS listing them, as a site mirror does.
func (l *Lab) startMirror(site *inventory.Inventory) (string, error) {
	img := simImage(l.cfg.ImageBytes)
	sum := sha256.Sum256(img)
	dir := filepath.Join(l.cfg.Dir, "mirror")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	var sums strings.Builder
	for _, im := range site.Images {
		name := im.Name + ".raw"
		if err := os.WriteFile(filepath.Join(dir, name), img, 0o644); err != nil {
			return "", err
		}
		fmt.Fprintf(&sums, "%s *%s\n", hex.EncodeToString(sum[:]), name)
	}
	if err := os.WriteFile(filepath.Join(dir, "SHA256SUMS"), []byte(sums.String()), 0o644); err != nil {
		return "", err
	}
	if err := l.mirrorFirmware(dir, site); err != nil {
		return "", err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	hs := &http.Server{Handler: http.FileServer(http.Dir(dir)), ReadHeaderTimeout: 10 * time.Second}
	l.servers = append(l.servers, hs)
	l.wg.Add(1)
	go func() { defer l.wg.Done(); _ = hs.Serve(ln) }()
	return "http://" + ln.Addr().String(), nil
}

// mirrorFirmware writes one file per entry of the site's firmware catalog
// under dir/firmware, named as the entry's URL names it (the BMC
// emulator reads the component and version from that name, as vendors
// name their packages), and sets the entry's URL, checksum and size to
// what the mirror serves; renderImages writes them.
func (l *Lab) mirrorFirmware(dir string, site *inventory.Inventory) error {
	if len(site.FirmwareImages) == 0 {
		return nil
	}
	if err := os.MkdirAll(filepath.Join(dir, "firmware"), 0o755); err != nil {
		return err
	}
	for i := range site.FirmwareImages {
		fi := &site.FirmwareImages[i]
		base := path.Base(fi.URL)
		body := simImage(64 << 10)
		copy(body, "machina simulated firmware "+fi.Name+"\n")
		if err := os.WriteFile(filepath.Join(dir, "firmware", base), body, 0o644); err != nil {
			return err
		}
		sum := sha256.Sum256(body)
		fi.Checksum, fi.SizeBytes = "sha256:"+hex.EncodeToString(sum[:]), int64(len(body))
		fi.URL = "{{mirror}}/firmware/" + base
	}
	return nil
}

// simImage is a deterministic raw disk image that starts with osMarker.
func simImage(n int) []byte {
	b := make([]byte, n)
	copy(b, osMarker)
	x := uint32(2463534242)
	for i := len(osMarker); i < n; i++ {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		b[i] = byte(x)
	}
	// A real MBR partition table: one Linux partition from sector 2048 to
	// the end of the image, so the agent places the seed after it.
	for i := 446; i < 510; i++ {
		b[i] = 0
	}
	e := b[446:462]
	e[0], e[4] = 0x80, 0x83
	binary.LittleEndian.PutUint32(e[8:], 2048)
	binary.LittleEndian.PutUint32(e[12:], uint32(n/512-2048))
	b[510], b[511] = 0x55, 0xaa
	return b
}

// writeRepo creates the bare repository and the operator's working clone
// holding the site's inventory with the simulated BMC addresses and the
// mirror's image URLs, committed and pushed.
func (l *Lab) writeRepo(site *inventory.Inventory, addrs map[string]string, bmcExtra map[string][]string) error {
	bare := filepath.Join(l.cfg.Dir, "repo.git")
	clone := filepath.Join(l.cfg.Dir, "inventory")
	if _, err := git.PlainInitWithOptions(bare, &git.PlainInitOptions{Bare: true, InitOptions: git.InitOptions{DefaultBranch: "refs/heads/main"}}); err != nil {
		return fmt.Errorf("sim: init repo: %w", err)
	}
	repo, err := git.PlainInitWithOptions(clone, &git.PlainInitOptions{InitOptions: git.InitOptions{DefaultBranch: "refs/heads/main"}})
	if err != nil {
		return fmt.Errorf("sim: init clone: %w", err)
	}
	l.RepoURL, l.Clone = "file://"+bare, clone
	if _, err := repo.CreateRemote(&gitconfig.RemoteConfig{Name: "origin", URLs: []string{l.RepoURL}}); err != nil {
		return err
	}
	// Track origin/main, so `git pull` in the clone brings the status commits.
	if err := repo.CreateBranch(&gitconfig.Branch{Name: "main", Remote: "origin", Merge: "refs/heads/main"}); err != nil {
		return err
	}
	files := map[string]string{
		inventory.ServersFile:  renderServers(site, addrs, l.fallbacks, bmcExtra),
		inventory.ProfilesFile: renderProfiles(site),
		inventory.ImagesFile:   renderImages(site, l.MirrorURL),
		inventory.NetworksFile: renderNetworks(site),
		"README.md":            "# Simulated site\n\nThe inventory of the simulated lab. Edit, commit and push; the controller\nreconciles and writes what it observed under status/.\n",
	}
	for name, body := range files {
		if body == "" {
			continue // an optional file the site has none of
		}
		if err := os.WriteFile(filepath.Join(clone, name), []byte(body), 0o644); err != nil {
			return err
		}
	}
	if _, err := inventory.Load(os.DirFS(clone), inventory.Limits{}); err != nil {
		return fmt.Errorf("sim: generated inventory is invalid (a bug): %w", err)
	}
	wt, err := repo.Worktree()
	if err != nil {
		return err
	}
	if err := wt.AddGlob("."); err != nil {
		return err
	}
	sig := &object.Signature{Name: "Sim Operator", Email: "operator@sim.invalid", When: time.Now()}
	if _, err := wt.Commit("inventory: simulated site", &git.CommitOptions{Author: sig, Committer: sig}); err != nil {
		return err
	}
	return repo.Push(&git.PushOptions{RemoteName: "origin", RefSpecs: []gitconfig.RefSpec{"refs/heads/main:refs/heads/main"}})
}

// SetController tells the machines where the controller is (its URL as
// machines reach it): they fetch their iPXE script there.
func (l *Lab) SetController(url string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ctrl = url
}

func (l *Lab) controllerURL() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ctrl
}

// AddStray adds a machine servers.yaml does not name: someone racked it and
// cabled its NIC (MAC mac, any form net.ParseMAC reads) to the provisioning
// network, and nobody told Machina about it or its BMC. The BMC is a bmcsim
// Redfish emulator on 127.0.0.1 serving the first vendor tree, with the
// lab's credentials; its URL is returned, to attach it later (machinactl
// server bmc-set). The machine stays off until [Machine.PowerOn]. name is
// the lab's handle for it (Lab.Machine), not an inventory name. Call it
// before the machines are read concurrently (before the controller acts).
func (l *Lab) AddStray(name, mac string) (*Machine, string, error) {
	hw, err := net.ParseMAC(mac)
	if err != nil || len(hw) != 6 {
		return nil, "", fmt.Errorf("sim: stray %s: bad MAC %q", name, mac)
	}
	if _, ok := l.machines[name]; ok {
		return nil, "", fmt.Errorf("sim: machine %s exists", name)
	}
	m := &Machine{Name: name, MAC: hw.String(), HW: hardwareFor("zone-a", len(l.machines)), lab: l, phase: PhaseOff, src: srcAddr(len(l.machines)),
		root: filepath.Join(l.machinesDir(), name, "root"), devDir: filepath.Join(l.machinesDir(), name, "dev"),
		log: l.log.With("sim", name)}
	m.agentHTTP = &http.Client{Timeout: 5 * time.Minute, Transport: planCapture{base: l.http.Transport, m: m}}
	if err := m.HW.writeTree(m.root, m.devDir, m.MAC); err != nil {
		return nil, "", fmt.Errorf("sim: %s hardware: %w", name, err)
	}
	fixtures, err := bmcsim.FixturesDir()
	if err != nil {
		return nil, "", fmt.Errorf("sim: redfish fixtures: %w", err)
	}
	dir, err := bmcsim.TreeDir(fixtures, simTrees[0])
	if err != nil {
		return nil, "", err
	}
	var trees bmcsim.Trees
	srv, err := trees.New(dir, bmcsim.Config{Username: l.cfg.Username, Password: l.cfg.Password, Power: m, SessionTimeout: -1,
		PowerTransition: l.cfg.PowerTransition, PowerTransitionKeepsState: l.cfg.PowerTransitionKeepsState,
		Firmware: bmcsim.Firmware{FetchImages: true}})
	if err != nil {
		return nil, "", fmt.Errorf("sim: %s BMC: %w", name, err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, "", err
	}
	hs := &http.Server{Handler: srv, ReadHeaderTimeout: 10 * time.Second}
	l.servers = append(l.servers, hs)
	l.wg.Add(1)
	go func() { defer l.wg.Done(); _ = hs.Serve(ln) }()
	l.machines[name], l.bmcs[name] = m, srv
	return m, "http://" + ln.Addr().String(), nil
}

// Machine returns the simulated machine called name, or nil.
func (l *Lab) Machine(name string) *Machine { return l.machines[name] }

// BMC returns the emulated BMC of name (for fault injection), or nil.
func (l *Lab) BMC(name string) *bmcsim.Server { return l.bmcs[name] }

// Machines returns every machine, sorted by name.
func (l *Lab) Machines() []*Machine {
	out := make([]*Machine, 0, len(l.machines))
	for _, m := range l.machines {
		out = append(out, m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Credentials returns the BMC account of the simulated BMCs, to store
// under the credential names the inventory uses.
func (l *Lab) Credentials() (user, password string) { return l.cfg.Username, l.cfg.Password }

// IPMIServers returns the names of the servers whose BMC is an ipmi_sim
// in this lab, sorted.
func (l *Lab) IPMIServers() []string {
	var out []string
	for name := range l.machines {
		if _, redfish := l.bmcs[name]; !redfish {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}

// RedfishFallbacks returns the servers whose inventory entry names an IPMI
// BMC but which run a bmcsim Redfish BMC in this lab (their servers.yaml
// entry says redfish), mapped to why: Config.RedfishOnly, or [IPMIMissing].
// Empty when every IPMI server has its ipmi_sim.
func (l *Lab) RedfishFallbacks() map[string]string {
	out := make(map[string]string, len(l.fallbacks))
	for k, v := range l.fallbacks {
		out[k] = v
	}
	return out
}

// Close powers every machine off and stops the BMCs and the mirror.
func (l *Lab) Close() {
	l.runMu.Lock()
	l.closing = true
	l.runMu.Unlock()
	l.cancel()
	for _, s := range l.ipmiSims {
		s.Stop()
	}
	for _, hs := range l.servers {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_ = hs.Shutdown(ctx)
		cancel()
	}
	l.wg.Wait()
	l.runs.Wait()
}

// powerOffHold is Config.PowerOffHold with its default; zero or less
// means no hold.
func (l *Lab) powerOffHold() time.Duration {
	switch d := l.cfg.PowerOffHold; {
	case d == 0:
		return DefaultPowerOffHold
	case d < 0:
		return 0
	default:
		return d
	}
}

// goRun starts f as a machine's boot goroutine unless the lab is closing.
func (l *Lab) goRun(f func()) {
	l.runMu.Lock()
	defer l.runMu.Unlock()
	if l.closing {
		return
	}
	l.runs.Add(1)
	go func() {
		defer l.runs.Done()
		f()
	}()
}

// srcAddr is the i-th machine's own loopback address (127.1.0.1,
// 127.1.0.2, ... 127.1.1.1, ...; Linux routes all of 127.0.0.0/8 to lo),
// the source of its joined OS's connections to the join listener. Real
// hosts each have their own address, and the listener caps the
// connections of one address (join.MaxConnsPerIP, 64): a lab whose hosts
// all came from 127.0.0.1 had their heartbeats refused at accept beyond
// 64 connections, and the controller marked them lost.
func srcAddr(i int) netip.Addr {
	return netip.AddrFrom4([4]byte{127, byte(1 + i/62500), byte(1 + i/250%250), byte(1 + i%250)})
}
