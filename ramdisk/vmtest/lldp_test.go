package vmtest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
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
	"github.com/machina-metal/machina/ramdisk/agent/agenttest"
	"golang.org/x/sys/unix"
)

// TestRamdiskLLDPInQemu boots the real ramdisk (static agent as /init,
// Debian's kernel, virtio-net) with two NICs: the boot NIC on qemu's user
// network, which hears no LLDP, and a second NIC on a tap in a network
// namespace where Debian's lldpd plays the switch port. Everything (tap,
// lldpd, the reference controller, qemu) lives in that namespace. The
// report's second NIC carries every field lldpd sent, the boot NIC none:
// the agent's AF_PACKET socket and multicast membership work on a real
// kernel's virtio-net, whose receive filter drops multicast it was not
// told about.
func TestRamdiskLLDPInQemu(t *testing.T) {
	peertest.Root(t, "a network namespace with a tap for the VM")
	needTools(t, "qemu-system-x86_64", "socat", "ip", "lldpd", "lldpcli", "apt-get", "dpkg-deb", "cpio", "depmod")
	kernel, initrd := buildRamdisk(t)
	var b [3]byte
	_, _ = rand.Read(b[:])
	ns := "lldp-" + hex.EncodeToString(b[:]) + "-vm"
	ip := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	ip("netns", "add", ns)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
	ip("-n", ns, "link", "set", "lo", "up")
	ip("-n", ns, "tuntap", "add", "dev", "swp3", "mode", "tap")
	ip("-n", ns, "link", "set", "swp3", "address", "02:00:5e:20:00:03", "up")

	// The reference controller, listening inside the namespace, where
	// qemu's guestfwd connects to it.
	var ln net.Listener
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread leaves with the goroutine
		f, err := os.Open("/run/netns/" + ns)
		if err == nil {
			err = unix.Setns(int(f.Fd()), unix.CLONE_NEWNET)
			f.Close()
		}
		if err == nil {
			ln, err = net.Listen("tcp", "127.0.0.1:0")
		}
		errc <- err
	}()
	if err := <-errc; err != nil {
		t.Fatalf("controller listener in %s: %v", ns, err)
	}
	ctl := agenttest.NewController(agenttest.ControllerConfig{CommissionToken: "commission-tok-lldp"})
	srv := &http.Server{Handler: ctl, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	port := ln.Addr().(*net.TCPAddr).Port

	dir := t.TempDir()
	for _, d := range []string{dir, filepath.Dir(dir)} {
		if err := os.Chmod(d, 0o755); err != nil { // lldpcli reaches the socket as _lldpd
			t.Fatal(err)
		}
	}
	conf := filepath.Join(dir, "lldpd.conf")
	if err := os.WriteFile(conf, []byte(`configure system hostname leaf-vm-a
configure lldp tx-interval 1
configure ports swp3 lldp portidsubtype local Ethernet1/3 description "vm0 second NIC"
configure ports swp3 lldp custom-tlv add oui 00,80,c2 subtype 1 oui-info 00,64
configure ports swp3 lldp custom-tlv add oui 00,80,c2 subtype 3 oui-info 00,64,04,70,72,6f,76
configure ports swp3 lldp custom-tlv add oui 00,12,0f subtype 4 oui-info 05,ee
`), 0o644); err != nil {
		t.Fatal(err)
	}
	var lldpLog bytes.Buffer
	lldpd := exec.Command("ip", "netns", "exec", ns, "lldpd", "-d", "-u", filepath.Join(dir, "lldpd.socket"), "-I", "swp3", "-C", "swp3", "-O", conf, "-L", peertest.Command(t, "lldpcli"))
	lldpd.Stdout, lldpd.Stderr = &lldpLog, &lldpLog
	if err := lldpd.Start(); err != nil {
		t.Fatalf("start lldpd: %v", err)
	}
	t.Cleanup(func() {
		_ = lldpd.Process.Kill()
		_ = lldpd.Wait()
		if t.Failed() {
			t.Logf("lldpd log:\n%s", lldpLog.String())
		}
	})

	const second = "52:54:00:12:34:57"
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	appendArgs := "console=ttyS0 panic=-1 loglevel=4 machina.url=http://10.0.2.100:8080 BOOTIF=01-" + strings.ReplaceAll(vmMAC, ":", "-") +
		" machina.final=poweroff machina.mode=commission machina.token=commission-tok-lldp machina.lldp_wait=20s"
	qemu := exec.CommandContext(ctx, "ip", "netns", "exec", ns, "qemu-system-x86_64",
		"-accel", "tcg", "-cpu", "max", "-m", "768", "-smp", "2",
		"-nodefaults", "-no-user-config", "-display", "none", "-no-reboot", "-serial", "stdio",
		"-kernel", kernel, "-initrd", initrd, "-append", appendArgs,
		"-netdev", fmt.Sprintf("user,id=n0,restrict=on,guestfwd=tcp:10.0.2.100:8080-cmd:socat - TCP:127.0.0.1:%d", port),
		"-device", "virtio-net-pci,netdev=n0,mac="+vmMAC,
		"-netdev", "tap,id=n1,ifname=swp3,script=no,downscript=no",
		"-device", "virtio-net-pci,netdev=n1,mac="+second,
		"-device", "virtio-rng-pci")
	var serial bytes.Buffer
	qemu.Stdout, qemu.Stderr = &serial, &serial
	t0 := time.Now()
	if err := qemu.Run(); err != nil || ctx.Err() != nil {
		t.Fatalf("qemu: %v (ctx %v)\nserial:\n%s", err, ctx.Err(), serial.String())
	}
	t.Logf("qemu ran %.1fs", time.Since(t0).Seconds())
	reps := ctl.Reports()
	if len(reps) != 1 {
		t.Fatalf("controller got %d reports\nserial:\n%s", len(reps), serial.String())
	}
	got := map[string]*v1.LLDP{}
	for _, n := range reps[0].Facts.NICs {
		got[n.MAC] = n.LLDP
	}
	want := map[string]*v1.LLDP{
		vmMAC: nil,
		second: {ChassisID: "02:00:5e:20:00:03", ChassisIDSubtype: "mac", SystemName: "leaf-vm-a", PortID: "Ethernet1/3", PortIDSubtype: "local",
			PortDescription: "vm0 second NIC", PortVLAN: 100, VLANs: []v1.LLDPVLAN{{ID: 100, Name: "prov"}}, MaxFrameSize: 1518},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("report NICs' LLDP by MAC (-want +got):\n%s\nserial:\n%s", d, serial.String())
	}
	t.Logf("agent: %s", lineWith(serial.String(), "lldp: neighbour"))
	t.Logf("kernel start to report: %v", reps[0].StartedToReport)
}
