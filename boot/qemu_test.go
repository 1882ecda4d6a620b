package boot_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/machina-metal/machina/boot"
	"github.com/machina-metal/machina/boot/dhcp"
	"github.com/machina-metal/machina/boot/internal/netnstest"
	"github.com/machina-metal/machina/boot/ipxe"
	"github.com/machina-metal/machina/boot/tftp"
	"github.com/machina-metal/machina/internal/peertest"
	"github.com/machina-metal/machina/macaddr"
)

// lab is one network namespace with a bridge and a tap, running our DHCP
// (full mode), TFTP (Debian's ipxe binaries) and the iPXE HTTP handler, all
// bound inside the namespace.
type lab struct {
	ns       string
	httpURL  string
	requests chan string // every HTTP request path+query, in order
	look     *boot.MemLookup
	dhcp     *dhcp.Server
	ra       *dhcp.Advertiser
	isoDir   string // served at /boot/iso/
	tftp     *tftp.Server
}

const (
	labMAC    = "52:54:00:12:34:56"
	ipxeDir   = "/usr/lib/ipxe"
	serverIP  = "10.67.0.1"
	serverNet = "10.67.0.1/24"
)

func newLab(t *testing.T, lifecycle boot.Lifecycle) *lab {
	return newLabFiles(t, lifecycle, dhcp.BootFiles{})
}

// newLabFiles is newLab with DHCP boot files (ScriptURL is filled in).
func newLabFiles(t *testing.T, lifecycle boot.Lifecycle, files dhcp.BootFiles) *lab {
	return newLabMode(t, lifecycle, files, dhcp.ModeFull)
}

// newLabMode is newLabFiles with a DHCP mode. In ModeProxy the lab also
// runs "the network's own" DHCP server, dnsmasq giving addresses only, in a
// second namespace whose veth is a port of the bridge (10.67.0.2), as on a
// site network whose DHCP is not Machina's.
// extraTFTP, when given, are files the TFTP server serves from memory
// (the arm64 GRUB image).
func newLabMode(t *testing.T, lifecycle boot.Lifecycle, files dhcp.BootFiles, mode dhcp.Mode, extraTFTP ...map[string][]byte) *lab {
	t.Helper()
	netnstest.RequireCommand(t, "qemu-system-x86_64")
	peertest.File(t, filepath.Join(ipxeDir, "snponly.efi"), "ipxe")
	br := netnstest.NewBridge(t, serverNet, 1)
	l := &lab{ns: br.NS, requests: make(chan string, 4096), look: &boot.MemLookup{}}
	parsed, _ := macaddr.Parse(labMAC)
	mac := parsed.HardwareAddr()
	if err := l.look.Set(boot.Assignment{MAC: mac, Name: "vm1", Lifecycle: lifecycle}); err != nil {
		t.Fatal(err)
	}
	logger := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })

	var httpLn net.Listener
	err := netnstest.Do(l.ns, func() error {
		var err error
		httpLn, err = net.Listen("tcp4", serverIP+":0")
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	l.httpURL = "http://" + httpLn.Addr().String()
	l.isoDir = t.TempDir()
	h, err := ipxe.New(ipxe.Config{Lookup: l.look, Tokens: boot.NewMemTokens(), ControllerURL: l.httpURL, BinDir: ipxeDir, ISODir: l.isoDir, Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/boot/ipxe", h)
	mux.Handle(boot.GRUBScriptPath, h)
	mux.Handle("/boot/bin/", h)
	mux.Handle("/boot/iso/", h)
	mux.HandleFunc("/boot/ramdisk/", func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "no ramdisk in this test", http.StatusNotFound)
	})
	hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case l.requests <- r.URL.RequestURI():
		default:
		}
		mux.ServeHTTP(w, r)
	})}
	wg.Go(func() { _ = hs.Serve(httpLn) })
	t.Cleanup(func() { _ = hs.Close() })

	if mode == dhcp.ModeProxy {
		otherDHCP(t, br.NS)
	}
	dcfg := dhcp.Config{
		Mode: mode, Interfaces: []string{"br0"}, Subnet: netip.MustParsePrefix(serverNet), PoolStart: netip.MustParseAddr("10.67.0.100"),
		PoolEnd: netip.MustParseAddr("10.67.0.150"), LeaseTime: time.Hour, Lookup: l.look, Logger: logger,
		Boot: files,
	}
	dcfg.Boot.ScriptURL = l.httpURL + ipxe.ScriptPath
	if dcfg.Boot.HTTPx64 == "auto" {
		dcfg.Boot.HTTPx64 = l.httpURL + "/boot/bin/snponly.efi"
	}
	tcfg := tftp.Config{Root: ipxeDir, Addr: serverIP + ":69", ScriptURL: l.httpURL + ipxe.ScriptPath, GRUBScriptURL: l.httpURL + boot.GRUBScriptPath, Logger: logger}
	if len(extraTFTP) > 0 {
		tcfg.Files = extraTFTP[0]
	}
	l.tftp, err = tftp.New(tcfg)
	if err != nil {
		t.Fatal(err)
	}
	err = netnstest.Do(l.ns, func() error {
		var err error
		if l.dhcp, err = dhcp.New(dcfg); err != nil { // finds br0's address inside the namespace
			return err
		}
		if err := l.dhcp.Listen(ctx); err != nil {
			return err
		}
		if l.ra, err = dhcp.NewAdvertiser(dhcp.RAConfig{Interfaces: []string{"br0"}, Interval: 2 * time.Second, Logger: logger}); err != nil {
			return err
		}
		if err := l.ra.Listen(); err != nil {
			return err
		}
		return l.tftp.Listen()
	})
	if err != nil {
		t.Fatal(err)
	}
	wg.Go(func() {
		if err := l.ra.Serve(ctx); err != nil {
			t.Errorf("advertiser Serve: %v", err)
		}
	})
	wg.Go(func() {
		if err := l.dhcp.Serve(ctx); err != nil {
			t.Errorf("dhcp Serve: %v", err)
		}
	})
	wg.Add(1)
	// TFTP opens a socket per transfer from its serving goroutine: serve
	// from a thread inside the namespace.
	if err := netnstest.Go(l.ns, func() {
		defer wg.Done()
		if err := l.tftp.Serve(ctx); err != nil {
			t.Errorf("tftp Serve: %v", err)
		}
	}); err != nil {
		wg.Done()
		t.Fatal(err)
	}
	return l
}

var ansi = regexp.MustCompile(`\x1b\[[0-9;?]*[A-Za-z]|\x1b[()][A-Z0-9]|[\x00-\x08\x0b-\x1f\x7f]`)

// runVM starts qemu (TCG) in the lab namespace and streams its serial
// console lines, cleaned of terminal escapes.
func runVM(t *testing.T, l *lab, args ...string) (lines <-chan string, console func() string) {
	t.Helper()
	return runVMWith(t, l, "qemu-system-x86_64", args...)
}

// runVMWith is runVM with another qemu binary (qemu-system-aarch64).
func runVMWith(t *testing.T, l *lab, qemu string, args ...string) (lines <-chan string, console func() string) {
	t.Helper()
	base := []string{"-accel", "tcg", "-m", "512", "-smp", "2", "-nodefaults", "-no-user-config", "-display", "none",
		"-serial", "stdio", "-no-reboot", "-netdev", "tap,id=n0,ifname=tap0,script=no,downscript=no"}
	cmd := netnstest.Command(l.ns, qemu, append(base, args...)...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill() // our own child, by PID
		_ = cmd.Wait()
	})
	ch := make(chan string, 1024)
	var mu sync.Mutex
	var all strings.Builder
	go func() {
		defer close(ch)
		r := bufio.NewReader(out)
		var cur []byte
		for {
			b, err := r.ReadByte()
			if err != nil {
				if err != io.EOF && !errors.Is(err, os.ErrClosed) {
					t.Logf("serial read: %v", err)
				}
				return
			}
			if b == '\n' || b == '\r' {
				line := strings.TrimSpace(ansi.ReplaceAllString(string(cur), ""))
				cur = cur[:0]
				if line != "" {
					mu.Lock()
					all.WriteString(line + "\n")
					mu.Unlock()
					select {
					case ch <- line:
					default:
					}
				}
				continue
			}
			cur = append(cur, b)
		}
	}()
	return ch, func() string { mu.Lock(); defer mu.Unlock(); return all.String() }
}

// waitSerial waits for a console line containing want.
func waitSerial(t *testing.T, lines <-chan string, console func() string, want string, d time.Duration) string {
	t.Helper()
	deadline := time.After(d)
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("qemu exited before %q; console:\n%s", want, console())
			}
			if strings.Contains(l, want) {
				return l
			}
		case <-deadline:
			t.Fatalf("no %q on the serial console within %v; console:\n%s", want, d, console())
		}
	}
}

// waitRequest waits for an HTTP request whose URI starts with prefix.
func waitRequest(t *testing.T, l *lab, prefix string, d time.Duration, console func() string) string {
	t.Helper()
	deadline := time.After(d)
	for {
		select {
		case r := <-l.requests:
			t.Logf("http: GET %s", r)
			if strings.HasPrefix(r, prefix) {
				return r
			}
		case <-deadline:
			t.Fatalf("no HTTP request %q within %v; console:\n%s", prefix, d, console())
		}
	}
}

// TestQEMUBIOSiPXEROM boots a SeaBIOS VM whose virtio NIC carries qemu's
// iPXE option ROM. iPXE's DHCP (user class "iPXE") gets the script URL from
// our DHCP server, fetches the chain script, comes back with its MAC and
// runs the commissioning script, which fetches the ramdisk kernel.
func TestQEMUBIOSiPXEROM(t *testing.T) {
	l := newLab(t, boot.LifecycleCommissioning)
	lines, console := runVM(t, l, "-machine", "pc,graphics=off", "-boot", "order=n",
		"-device", "virtio-net-pci,netdev=n0,mac="+labMAC)
	start := time.Now()
	first := waitRequest(t, l, "/boot/ipxe", 120*time.Second, console)
	if first != "/boot/ipxe" {
		t.Fatalf("first request %q, want the bare script URL from DHCP", first)
	}
	second := waitRequest(t, l, "/boot/ipxe?mac=", 60*time.Second, console)
	if !strings.Contains(second, "mac=52-54-00-12-34-56") || !strings.Contains(second, "platform=pcbios") {
		t.Fatalf("chained request %q", second)
	}
	waitSerial(t, lines, console, "Machina: "+labMAC+" (vm1) lifecycle=commissioning platform=pcbios", 60*time.Second)
	waitRequest(t, l, "/boot/ramdisk/vmlinuz", 60*time.Second, console)
	t.Logf("BIOS iPXE ROM: DHCP → script → kernel request in %v", time.Since(start).Round(time.Millisecond))
	if st := l.dhcp.Stats(); st.Acks < 1 || st.Malformed != 0 {
		t.Fatalf("dhcp stats %+v", st)
	}
}

// TestQEMUUEFINativePXE boots OVMF with the NIC's option ROM removed, so
// EDK2's own PXE client (option 93 arch 7) runs: it gets snponly.efi over
// our TFTP (asking tsize first), which starts iPXE; iPXE's DHCP gets the
// script URL; the script carries initrd=NAME on the kernel line (UEFI).
func TestQEMUUEFINativePXE(t *testing.T) {
	l := newLab(t, boot.LifecycleDeploying)
	code, myVars := ovmf(t)
	lines, console := runVM(t, l, "-machine", "q35",
		"-drive", "if=pflash,format=raw,readonly=on,file="+code, "-drive", "if=pflash,format=raw,file="+myVars,
		"-device", "virtio-net-pci,netdev=n0,mac="+labMAC+",romfile=")
	start := time.Now()
	second := waitRequest(t, l, "/boot/ipxe?mac=", 240*time.Second, console)
	if !strings.Contains(second, "mac=52-54-00-12-34-56") || !strings.Contains(second, "platform=efi") {
		t.Fatalf("chained request %q", second)
	}
	waitSerial(t, lines, console, "Machina: "+labMAC+" (vm1) lifecycle=deploying platform=efi", 60*time.Second)
	waitRequest(t, l, "/boot/ramdisk/vmlinuz", 60*time.Second, console)
	t.Logf("UEFI native PXE: DHCP → TFTP snponly.efi → DHCP → script → kernel request in %v", time.Since(start).Round(time.Millisecond))
	// EDK2's PXE (Debian 12's OVMF) reads the size first and aborts (ERROR
	// 8: Probed, not Failed), then asks windowsize=4 (PcdPxeTftpWindowSize),
	// which the server grants (RFC 7440): the real client of the windowed
	// path.
	if st := l.tftp.Stats(); st.Served < 1 || st.Windowed < 1 || st.Probed < 1 || st.Failed != 0 {
		t.Fatalf("tftp stats %+v: want snponly.efi served windowed after a size probe, nothing failed", st)
	}
}

// buildISOs runs scripts/metal/build-ipxe-iso.sh for the lab's controller URL
// into the directory the handler serves at /boot/iso/, and checks that the
// embedded script is boot.ChainScript's text.
func buildISOs(t *testing.T, l *lab) string {
	t.Helper()
	netnstest.RequireCommand(t, "xorriso")
	netnstest.RequireCommand(t, "mformat")
	dir := l.isoDir
	out, err := exec.Command("sh", "../scripts/metal/build-ipxe-iso.sh", l.httpURL, dir).CombinedOutput()
	if err != nil {
		t.Fatalf("build-ipxe-iso.sh: %v\n%s", err, out)
	}
	want, err := boot.ChainScript(l.httpURL + ipxe.ScriptPath)
	if err != nil {
		t.Fatal(err)
	}
	for _, iso := range []string{"machina-ipxe-bios.iso", "machina-ipxe-uefi.iso"} {
		got := filepath.Join(t.TempDir(), "machina.ipxe")
		if out, err := exec.Command("xorriso", "-indev", filepath.Join(dir, iso), "-osirrox", "on", "-extract", "/machina.ipxe", got).CombinedOutput(); err != nil {
			t.Fatalf("extract script from %s: %v\n%s", iso, err, out)
		}
		b, _ := os.ReadFile(got)
		if string(b) != string(want) {
			t.Fatalf("%s embeds %q, want boot.ChainScript's %q", iso, b, want)
		}
	}
	return dir
}

// TestQEMUBIOSISO boots SeaBIOS from the BIOS ISO (no NIC option ROM),
// read by qemu's curl block driver from the controller's /boot/iso/ URL with
// Range requests, as a BMC's virtual media (Redfish InsertMedia) would:
// ISOLINUX starts ipxe.lkrn, which runs the embedded script, so the first
// script request already carries the MAC.
func TestQEMUBIOSISO(t *testing.T) {
	l := newLab(t, boot.LifecycleReady)
	buildISOs(t, l)
	isoURL := l.httpURL + "/boot/iso/machina-ipxe-bios.iso"
	lines, console := runVM(t, l, "-machine", "pc,graphics=off", "-boot", "order=d",
		"-drive", "file="+isoURL+",media=cdrom,readonly=on",
		"-device", "virtio-net-pci,netdev=n0,mac="+labMAC+",romfile=")
	start := time.Now()
	first := waitRequest(t, l, "/boot/ipxe", 120*time.Second, console)
	if !strings.HasPrefix(first, "/boot/ipxe?mac=52-54-00-12-34-56&platform=pcbios") {
		t.Fatalf("first request %q, want the embedded script's chain with the MAC", first)
	}
	waitSerial(t, lines, console, "Machina: "+labMAC+" (vm1) lifecycle=ready platform=pcbios", 60*time.Second)
	t.Logf("BIOS ISO: boot → embedded script → lifecycle script in %v", time.Since(start).Round(time.Millisecond))
}

// TestQEMUUEFIISO boots OVMF from the UEFI ISO. The DHCP server names a
// UEFI PXE file that does not exist, so only the ISO's ipxe.efi can reach
// the script (through DHCP's iPXE user-class answer).
func TestQEMUUEFIISO(t *testing.T) {
	l := newLabFiles(t, boot.LifecycleReady, dhcp.BootFiles{UEFI: "absent.efi"})
	dir := buildISOs(t, l)
	code, myVars := ovmf(t)
	lines, console := runVM(t, l, "-machine", "q35",
		"-drive", "if=pflash,format=raw,readonly=on,file="+code, "-drive", "if=pflash,format=raw,file="+myVars,
		"-drive", "file="+filepath.Join(dir, "machina-ipxe-uefi.iso")+",media=cdrom,readonly=on,if=none,id=cd0",
		"-device", "ide-cd,drive=cd0,bootindex=0",
		"-device", "virtio-net-pci,netdev=n0,mac="+labMAC+",romfile=")
	start := time.Now()
	waitRequest(t, l, "/boot/ipxe?mac=52-54-00-12-34-56&platform=efi", 240*time.Second, console)
	waitSerial(t, lines, console, "Machina: "+labMAC+" (vm1) lifecycle=ready platform=efi", 60*time.Second)
	t.Logf("UEFI ISO: boot → iPXE DHCP → script in %v", time.Since(start).Round(time.Millisecond))
}

// ovmf returns OVMF's code image and a private copy of its variable store.
func ovmf(t *testing.T) (code, vars string) {
	t.Helper()
	code = "/usr/share/OVMF/OVMF_CODE_4M.fd"
	src := "/usr/share/OVMF/OVMF_VARS_4M.fd"
	for _, f := range []string{code, src} {
		peertest.File(t, f, "ovmf")
	}
	v, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	vars = filepath.Join(t.TempDir(), "vars.fd")
	if err := os.WriteFile(vars, v, 0o600); err != nil {
		t.Fatal(err)
	}
	return code, vars
}

// TestQEMUUEFIHTTPBoot boots OVMF with native networking only and no usable
// PXE file, so it falls through to UEFI HTTP boot (option 93 arch 16): our
// DHCP answers with option 60 "HTTPClient" and the URL of snponly.efi, which
// the firmware downloads over HTTP and runs; iPXE then fetches the script.
func TestQEMUUEFIHTTPBoot(t *testing.T) {
	l := newLabFiles(t, boot.LifecycleReady, dhcp.BootFiles{UEFI: "absent.efi", HTTPx64: "auto"})
	code, myVars := ovmf(t)
	// OVMF's fw_cfg knobs switch its PXE clients off (the IPv6 one alone
	// waits ~100 s for DHCPv6), leaving HTTP boot.
	lines, console := runVM(t, l, "-machine", "q35",
		"-drive", "if=pflash,format=raw,readonly=on,file="+code, "-drive", "if=pflash,format=raw,file="+myVars,
		"-fw_cfg", "name=opt/org.tianocore/IPv4PXESupport,string=n",
		"-fw_cfg", "name=opt/org.tianocore/IPv6PXESupport,string=n",
		"-device", "virtio-net-pci,netdev=n0,mac="+labMAC+",romfile=")
	start := time.Now()
	waitRequest(t, l, "/boot/bin/snponly.efi", 240*time.Second, console)
	waitRequest(t, l, "/boot/ipxe?mac=52-54-00-12-34-56&platform=efi", 120*time.Second, console)
	waitSerial(t, lines, console, "Machina: "+labMAC+" (vm1) lifecycle=ready platform=efi", 60*time.Second)
	t.Logf("UEFI HTTP boot: DHCP (HTTPClient) → HTTP snponly.efi → DHCP → script in %v", time.Since(start).Round(time.Millisecond))
}

// otherDHCP starts dnsmasq as a plain DHCP server (addresses only, no boot
// options) in its own namespace, attached to the lab bridge.
func otherDHCP(t *testing.T, labNS string) {
	t.Helper()
	dnsmasq := netnstest.RequireCommand(t, "dnsmasq")
	p := netnstest.NewPair(t, "10.67.0.2/24") // Server side runs dnsmasq; the Client end joins the bridge
	netnstest.Run(t, "ip", "-n", p.Client, "link", "set", p.ClientIf, "netns", labNS)
	netnstest.Run(t, "ip", "-n", labNS, "link", "set", p.ClientIf, "master", "br0")
	netnstest.Run(t, "ip", "-n", labNS, "link", "set", p.ClientIf, "up")
	dir := t.TempDir()
	conf := filepath.Join(dir, "dnsmasq.conf")
	if err := os.WriteFile(conf, []byte(fmt.Sprintf(`port=0
no-resolv
no-hosts
interface=%s
bind-interfaces
dhcp-range=10.67.0.160,10.67.0.199,255.255.255.0,1h
dhcp-leasefile=%s/leases
`, p.ServerIf, dir)), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := netnstest.Command(p.Server, dnsmasq, "--keep-in-foreground", "--user=root", "--conf-file="+conf, "--pid-file="+dir+"/pid", "--log-facility=-")
	cmd.Stdout, cmd.Stderr = t.Output(), t.Output()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
}

// TestQEMUBIOSProxyDHCP boots the iPXE NIC ROM on a segment whose addresses
// come from dnsmasq; Machina runs proxyDHCP only. iPXE combines dnsmasq's
// address with our ProxyDHCP offer (and its request to port 4011) and
// fetches the script from us.
func TestQEMUBIOSProxyDHCP(t *testing.T) {
	l := newLabMode(t, boot.LifecycleCommissioning, dhcp.BootFiles{}, dhcp.ModeProxy)
	lines, console := runVM(t, l, "-machine", "pc,graphics=off", "-boot", "order=n",
		"-device", "virtio-net-pci,netdev=n0,mac="+labMAC)
	start := time.Now()
	waitRequest(t, l, "/boot/ipxe?mac=52-54-00-12-34-56&platform=pcbios", 120*time.Second, console)
	waitSerial(t, lines, console, "Machina: "+labMAC+" (vm1) lifecycle=commissioning platform=pcbios", 60*time.Second)
	t.Logf("BIOS via proxyDHCP: dnsmasq address + our ProxyDHCP → script in %v", time.Since(start).Round(time.Millisecond))
	if st := l.dhcp.Stats(); st.Offers < 1 {
		t.Fatalf("proxy stats %+v: no ProxyDHCP offer sent", st)
	}
	t.Logf("proxy stats %+v", l.dhcp.Stats())
}

// TestQEMUUEFIISOProxyDHCP boots the UEFI ISO (Debian 12 iPXE, no embedded
// script) on that segment: the script URL comes only from our proxyDHCP.
func TestQEMUUEFIISOProxyDHCP(t *testing.T) {
	l := newLabMode(t, boot.LifecycleReady, dhcp.BootFiles{}, dhcp.ModeProxy)
	dir := buildISOs(t, l)
	code, myVars := ovmf(t)
	lines, console := runVM(t, l, "-machine", "q35",
		"-drive", "if=pflash,format=raw,readonly=on,file="+code, "-drive", "if=pflash,format=raw,file="+myVars,
		"-drive", "file="+filepath.Join(dir, "machina-ipxe-uefi.iso")+",media=cdrom,readonly=on,if=none,id=cd0",
		"-device", "ide-cd,drive=cd0,bootindex=0",
		"-device", "virtio-net-pci,netdev=n0,mac="+labMAC+",romfile=")
	start := time.Now()
	waitRequest(t, l, "/boot/ipxe?mac=52-54-00-12-34-56&platform=efi", 240*time.Second, console)
	waitSerial(t, lines, console, "Machina: "+labMAC+" (vm1) lifecycle=ready platform=efi", 60*time.Second)
	t.Logf("UEFI ISO via proxyDHCP: script in %v", time.Since(start).Round(time.Millisecond))
}

// TestQEMUUEFINativePXEProxyDHCP runs OVMF's own PXE client (no iPXE ROM) on
// the proxyDHCP segment: address from dnsmasq, boot file from our
// ProxyDHCP offer, snponly.efi over our TFTP, then iPXE takes the script URL
// from our proxy too.
func TestQEMUUEFINativePXEProxyDHCP(t *testing.T) {
	l := newLabMode(t, boot.LifecycleDeploying, dhcp.BootFiles{}, dhcp.ModeProxy)
	code, myVars := ovmf(t)
	lines, console := runVM(t, l, "-machine", "q35",
		"-drive", "if=pflash,format=raw,readonly=on,file="+code, "-drive", "if=pflash,format=raw,file="+myVars,
		"-fw_cfg", "name=opt/org.tianocore/IPv6PXESupport,string=n",
		"-device", "virtio-net-pci,netdev=n0,mac="+labMAC+",romfile=")
	start := time.Now()
	waitRequest(t, l, "/boot/ipxe?mac=52-54-00-12-34-56&platform=efi", 240*time.Second, console)
	waitSerial(t, lines, console, "Machina: "+labMAC+" (vm1) lifecycle=deploying platform=efi", 60*time.Second)
	t.Logf("UEFI native PXE via proxyDHCP: script in %v; dhcp %+v; tftp %+v", time.Since(start).Round(time.Millisecond), l.dhcp.Stats(), l.tftp.Stats())
	if st := l.tftp.Stats(); st.Served < 1 {
		t.Fatalf("tftp stats %+v: snponly.efi not served", st)
	}
}
