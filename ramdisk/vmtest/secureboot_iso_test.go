package vmtest

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/machina-metal/machina/internal/peertest"
	"github.com/machina-metal/machina/ramdisk/agent/agenttest"
)

// TestSecureBootISOCommissionInQemu boots the Secure Boot virtual-media
// ISO (scripts/metal/build-sb-iso.sh) as a CD-ROM on OVMF with Secure Boot
// on and Microsoft's keys enrolled (OVMF_CODE_4M.ms.fd and a copy of
// OVMF_VARS_4M.ms.fd, q35 with SMM; TCG), the way a BMC's InsertMedia
// boots it: shim (signed by Microsoft) loads Debian's signed GRUB from the
// ISO, GRUB takes a lease with net_bootp and sources grub/grub.cfg from
// the controller host's TFTP server (qemu's built-in one at 10.0.2.2
// stands in here), which boots the ramdisk's kernel (Debian's signed one,
// verified by shim) and initrd with the machine's kernel arguments, and the
// agent commissions and reports to the reference controller. The kernel
// log on the serial console must say that Secure Boot was on.
//
// The per-machine configuration is written by the test, in the form the
// controller's Secure Boot network path serves it over TFTP; its MAC
// comes from ${net_default_mac}, which the ISO's script points at the
// first NIC that got a lease, so the report's boot MAC checks that too.
func TestSecureBootISOCommissionInQemu(t *testing.T) {
	needTools(t, "qemu-system-x86_64", "socat", "xorriso", "mformat", "mcopy", "mmd", "apt-get", "dpkg-deb", "cpio", "depmod")
	const code, vars = "/usr/share/OVMF/OVMF_CODE_4M.ms.fd", "/usr/share/OVMF/OVMF_VARS_4M.ms.fd"
	peertest.File(t, code, "ovmf")
	peertest.File(t, vars, "ovmf")
	peertest.File(t, "/usr/lib/shim/shimx64.efi.signed", "shim-signed")
	peertest.File(t, "/usr/lib/grub/x86_64-efi-signed/grubnetx64.efi.signed", "grub-efi-amd64-signed")
	kernel, initrd := buildRamdisk(t)

	// The ISO, built for a controller at 10.0.2.2: qemu's user network
	// answers TFTP there.
	isoDir := t.TempDir()
	t0 := time.Now()
	b, err := exec.Command("sh", filepath.Join(repoRoot(t), "scripts", "metal", "build-sb-iso.sh"), "http://10.0.2.2:8080", isoDir).CombinedOutput()
	if err != nil {
		t.Fatalf("build-sb-iso.sh: %v\n%s", err, b)
	}
	iso := filepath.Join(isoDir, "machina-sb-uefi.iso")
	fi, err := os.Stat(iso)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("build-sb-iso.sh: %d bytes in %.1fs", fi.Size(), time.Since(t0).Seconds())

	const tok = "commission-tok-sbiso"
	ctl, port := controller(t, agenttest.ControllerConfig{CommissionToken: tok})
	tftp := t.TempDir()
	for name, src := range map[string]string{"vmlinuz": kernel, "initrd.cpio.gz": initrd} {
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(tftp, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(filepath.Join(tftp, "grub"), 0o755); err != nil {
		t.Fatal(err)
	}
	// loglevel=7: the kernel's "secureboot:" line is KERN_INFO.
	cfg := `echo "Machina: ${net_default_mac} lifecycle=commissioning platform=efi arch=x86_64"
linux (tftp,10.0.2.2)/vmlinuz console=ttyS0 panic=-1 loglevel=7 machina.final=poweroff machina.url=http://10.0.2.100:8080 machina.mac=${net_default_mac} machina.mode=commission machina.token=` + tok + `
initrd (tftp,10.0.2.2)/initrd.cpio.gz
boot
`
	if err := os.WriteFile(filepath.Join(tftp, "grub", "grub.cfg"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	varsCopy := filepath.Join(t.TempDir(), "vars.fd")
	vb, err := os.ReadFile(vars)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(varsCopy, vb, 0o644); err != nil {
		t.Fatal(err)
	}
	disk := filepath.Join(t.TempDir(), "disk.raw")
	if f, err := os.Create(disk); err != nil {
		t.Fatal(err)
	} else {
		f.Truncate(1 << 30)
		f.Close()
	}
	const mac = "52:54:00:12:34:5b"
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	// The NIC has a boot index too: OVMF connects only the devices of
	// qemu's boot order, and GRUB's efinet needs the firmware's network
	// driver bound (real firmware: its UEFI network stack turned on).
	// romfile= leaves out qemu's unsigned iPXE option ROM, which Secure
	// Boot would refuse anyway; OVMF's own virtio-net driver serves.
	args := []string{
		"-machine", "q35,smm=on", "-global", "driver=cfi.pflash01,property=secure,value=on",
		"-accel", "tcg", "-cpu", "max", "-smp", "2", "-m", "1024",
		"-nodefaults", "-no-user-config", "-display", "none", "-no-reboot", "-serial", "stdio",
		"-drive", "if=pflash,format=raw,unit=0,readonly=on,file=" + code,
		"-drive", "if=pflash,format=raw,unit=1,file=" + varsCopy,
		"-drive", "file=" + iso + ",media=cdrom,if=none,id=cd0,readonly=on",
		"-device", "ide-cd,drive=cd0,bus=ide.0,bootindex=0",
		"-netdev", fmt.Sprintf("user,id=n0,restrict=on,tftp=%s,guestfwd=tcp:10.0.2.100:8080-cmd:socat - TCP:127.0.0.1:%d", tftp, port),
		"-device", "virtio-net-pci,netdev=n0,mac=" + mac + ",romfile=,bootindex=1",
		"-device", "virtio-rng-pci",
		"-drive", "file=" + disk + ",format=raw,if=none,id=d0,cache=unsafe",
		"-device", "virtio-blk-pci,drive=d0,serial=machina-sb0",
	}
	cmd := exec.CommandContext(ctx, "qemu-system-x86_64", args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	t0 = time.Now()
	err = cmd.Run()
	elapsed := time.Since(t0)
	serial := out.String()
	t.Logf("qemu-system-x86_64 (TCG, OVMF Secure Boot) ran %.1fs", elapsed.Seconds())
	if err != nil || ctx.Err() != nil {
		t.Fatalf("qemu: %v (ctx %v)\nserial:\n%s", err, ctx.Err(), tail(serial, 8000))
	}
	for _, want := range []string{
		"Machina: DHCP",                              // the ISO's own script ran under GRUB
		"Machina: " + mac + " ",                      // the per-machine configuration got the NIC's MAC
		"Secure boot enabled",                        // the kernel's EFI Secure Boot check (arch/x86 "secureboot:")
		"Kernel is locked down from EFI Secure Boot", // Debian's lockdown under Secure Boot
	} {
		if !strings.Contains(serial, want) {
			t.Errorf("serial console lacks %q", want)
		}
	}
	if strings.Contains(serial, "Secure boot disabled") {
		t.Errorf("the kernel says Secure Boot was off")
	}
	reps := ctl.Reports()
	if len(reps) != 1 {
		t.Fatalf("controller got %d reports\nserial:\n%s", len(reps), tail(serial, 8000))
	}
	rep := reps[0]
	if !rep.Passed() {
		t.Errorf("commissioning failed: %+v\nserial:\n%s", rep.Tests, tail(serial, 8000))
	}
	if rep.BootMAC != mac || rep.Facts.CPU.Arch != "amd64" {
		t.Errorf("report identity = mac %s arch %q, want %s, amd64", rep.BootMAC, rep.Facts.CPU.Arch, mac)
	}
	t.Logf("%s; %s; kernel start to report %v; qemu start to power-off %.1fs",
		lineWith(serial, "Secure boot enabled"), lineWith(serial, "locked down"), rep.StartedToReport, elapsed.Seconds())
}
