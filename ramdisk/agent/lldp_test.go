package agent

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/internal/peertest"
	"golang.org/x/sys/unix"
)

func ipRun(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// inNetns runs fn on an OS thread switched into the named namespace; the
// thread is left locked (and so discarded by the runtime) afterwards.
func inNetns(t *testing.T, ns string, fn func()) {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with the goroutine
		f, err := os.Open("/run/netns/" + ns)
		if err != nil {
			done <- err
			return
		}
		defer f.Close()
		if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
			done <- err
			return
		}
		fn()
		done <- nil
	}()
	if err := <-done; err != nil {
		t.Fatalf("netns %s: %v", ns, err)
	}
}

// lldpLab is a switch namespace running Debian's lldpd on swp1 and swp2,
// cabled by veth pairs to eth0 and eth1 of a host namespace; eth2 is cabled
// to a port with no LLDP agent. It returns the host namespace's name.
func lldpLab(t *testing.T, conf string) string {
	t.Helper()
	peertest.Root(t, "network namespaces")
	peertest.Commands(t, "ip", "lldpd", "lldpcli")
	var b [3]byte
	_, _ = rand.Read(b[:])
	sfx := hex.EncodeToString(b[:])
	sw, host := "lldp-"+sfx+"-sw", "lldp-"+sfx+"-h"
	for _, ns := range []string{sw, host} {
		ipRun(t, "netns", "add", ns)
		t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
		ipRun(t, "-n", ns, "link", "set", "lo", "up")
	}
	for i, mac := range []string{"02:00:5e:10:00:01", "02:00:5e:10:00:02", "02:00:5e:10:00:03"} {
		sp, hp := "swp"+string(rune('1'+i)), "eth"+string(rune('0'+i))
		ipRun(t, "-n", sw, "link", "add", sp, "address", mac, "type", "veth", "peer", "name", hp, "netns", host)
		ipRun(t, "-n", sw, "link", "set", sp, "up")
	}
	ipRun(t, "-n", host, "link", "set", "eth0", "up") // eth1 and eth2 stay down: ListenLLDP raises them
	dir := t.TempDir()
	// lldpd's control socket is reached by lldpcli after it drops to the
	// _lldpd user: the directories must be searchable by it.
	for _, d := range []string{dir, filepath.Dir(dir)} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	cf := filepath.Join(dir, "lldpd.conf")
	if err := os.WriteFile(cf, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "lldpd.socket")
	log, err := os.Create(filepath.Join(dir, "lldpd.log"))
	if err != nil {
		t.Fatal(err)
	}
	// -d foreground, -u its own control socket (the distribution's service
	// keeps /run/lldpd.socket), -I only the cabled ports, -C the chassis
	// ID from swp1's MAC, -O this test's configuration, read at start.
	cmd := exec.Command("ip", "netns", "exec", sw, "lldpd", "-d", "-u", sock, "-I", "swp1,swp2", "-C", "swp1", "-O", cf, "-L", peertest.Command(t, "lldpcli"))
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatalf("start lldpd: %v", err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		log.Close()
		if t.Failed() {
			b, _ := os.ReadFile(log.Name())
			t.Logf("lldpd log:\n%s", b)
		}
	})
	return host
}

// lldpdConf makes lldpd send, every second: on swp1 a locally assigned
// port ID, a description, port VLAN 100, VLAN names 100 "prov" and 200
// "storage" and a 9216-byte maximum frame size (as 802.1 and 802.3
// organisationally specific TLVs: this machine's kernel has no 8021q
// module for VLAN links lldpd would read them from); on swp2 the interface
// name as port ID and as description (lldpd's default description).
const lldpdConf = `configure system hostname leaf-r1-a
configure lldp tx-interval 1
configure lldp portidsubtype ifname
configure ports swp1 lldp portidsubtype local Ethernet1/7 description "r1-n01 eth0"
configure ports swp1 lldp custom-tlv add oui 00,80,c2 subtype 1 oui-info 00,64
configure ports swp1 lldp custom-tlv add oui 00,80,c2 subtype 3 oui-info 00,64,04,70,72,6f,76
configure ports swp1 lldp custom-tlv add oui 00,80,c2 subtype 3 oui-info 00,c8,07,73,74,6f,72,61,67,65
configure ports swp1 lldp custom-tlv add oui 00,12,0f subtype 4 oui-info 24,00
`

// TestListenLLDPAgainstLLDPD checks every field ListenLLDP reports against
// frames from Debian's lldpd, on two NICs heard in one listen (one of them
// down before), and a third NIC with no agent absent and left down.
func TestListenLLDPAgainstLLDPD(t *testing.T) {
	host := lldpLab(t, lldpdConf)
	var got map[string]*v1.LLDP
	var t0 time.Time
	var elapsed time.Duration
	inNetns(t, host, func() {
		t0 = time.Now()
		// eth2 hears nothing, so the listen runs its full bound: long
		// enough for lldpd's start and first frames on a loaded machine.
		got = ListenLLDP(context.Background(), []string{"eth0", "eth1", "eth2"}, 20*time.Second, nil)
		elapsed = time.Since(t0)
	})
	chassis := "02:00:5e:10:00:01"
	want := map[string]*v1.LLDP{
		"eth0": {ChassisID: chassis, ChassisIDSubtype: "mac", SystemName: "leaf-r1-a", PortID: "Ethernet1/7", PortIDSubtype: "local",
			PortDescription: "r1-n01 eth0", PortVLAN: 100, VLANs: []v1.LLDPVLAN{{ID: 100, Name: "prov"}, {ID: 200, Name: "storage"}}, MaxFrameSize: 9216},
		"eth1": {ChassisID: chassis, ChassisIDSubtype: "mac", SystemName: "leaf-r1-a", PortID: "swp2", PortIDSubtype: "ifname", PortDescription: "swp2"},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("ListenLLDP (-want +got):\n%s", d)
	}
	t.Logf("listened %v on 3 NICs at once", elapsed.Round(time.Millisecond))
	inNetns(t, host, func() {
		for _, n := range []string{"eth1", "eth2"} {
			ifi, err := net.InterfaceByName(n)
			if err != nil || ifi.Flags&net.FlagUp != 0 {
				t.Errorf("%s after the listen: %v, flags %v; want down again", n, err, ifi.Flags)
			}
		}
	})
	for n, l := range got {
		if err := l.Validate(); err != nil {
			t.Errorf("%s: Validate: %v", n, err)
		}
	}
}

// TestDecodeLLDPRefuses covers frames DecodeLLDP must refuse: another
// destination, another ethertype, and truncated or malformed TLVs (a
// VLAN Name TLV shorter than its fixed part made gopacket index past it).
func TestDecodeLLDPRefuses(t *testing.T) {
	hdr := func(dst string, et string) string { return dst + "020000000001" + et }
	lldpdu := "0207040200000000010403076131" + "06020078" // chassis mac, port local "a1", ttl 120
	badVLAN := "fe0600" + "80c2030064"                    // 802.1 VLAN Name with 2 bytes of info
	for name, h := range map[string]string{
		"other destination":   hdr("0180c2000003", "88cc") + lldpdu + "0000",
		"other ethertype":     hdr("0180c200000e", "0800") + lldpdu + "0000",
		"truncated":           hdr("0180c200000e", "88cc") + "0207",
		"short VLAN name TLV": hdr("0180c200000e", "88cc") + lldpdu + badVLAN + "0000",
	} {
		b, err := hex.DecodeString(h)
		if err != nil {
			t.Fatal(name, err)
		}
		if l, err := DecodeLLDP(b); err == nil {
			t.Errorf("%s: DecodeLLDP = %+v, want an error", name, l)
		}
	}
	ok, _ := hex.DecodeString(hdr("0180c200000e", "88cc") + lldpdu + "0000")
	l, err := DecodeLLDP(ok)
	if err != nil || l.ChassisID != "02:00:00:00:00:01" || l.PortID != "a1" || l.PortIDSubtype != "local" {
		t.Errorf("DecodeLLDP(minimal) = %+v, %v", l, err)
	}
}

// FuzzDecodeLLDP: no frame panics the decoder, and whatever it returns is
// within v1.LLDP.Validate's bounds and survives the report's JSON as is
// (valid UTF-8), so a hostile or broken switch cannot get a commissioning
// report refused.
func FuzzDecodeLLDP(f *testing.F) {
	hdr := "0180c200000e02000000000188cc"
	for _, h := range []string{
		hdr + "0207040200000000010403076131" + "06020078" + "0000",
		hdr + "0207040200000000010403076131" + "06020078" + "fe06" + "0080c201ffff" + "fe0a0080c2030064" + "04ff707276" + "fe060012" + "0f0405ee" + "0000",
		hdr + "0207040200000000010403076131" + "06020078" + "0a04ffc3a8ff" + "fe0600" + "80c2030064" + "0000",
	} {
		b, err := hex.DecodeString(h)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, frame []byte) {
		if len(frame) > 9216 {
			return
		}
		l, err := DecodeLLDP(frame)
		if err != nil {
			return
		}
		if err := l.Validate(); err != nil {
			t.Fatalf("DecodeLLDP = %+v: %v", l, err)
		}
		b, err := json.Marshal(l)
		if err != nil {
			t.Fatal(err)
		}
		var back v1.LLDP
		if err := json.Unmarshal(b, &back); err != nil || !cmp.Equal(*l, back) {
			t.Fatalf("JSON round trip of %+v = %+v, %v", *l, back, err)
		}
	})
}
