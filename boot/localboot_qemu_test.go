package boot_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/machina-metal/machina/boot"
	"github.com/machina-metal/machina/boot/internal/netnstest"
)

// diskMarker is what markerDisk's boot code writes to COM1.
const diskMarker = "MACHINA-TEST-DISK: booted from the disk's MBR"

// markerDisk writes a 1 MiB raw disk whose MBR boot code (16-bit real mode,
// loaded at 0000:7C00) writes diskMarker to the first serial port (0x3F8)
// and halts: seeing the line on the console proves the firmware (or
// iPXE's sanboot) ran the disk's boot code.
func markerDisk(t *testing.T) string {
	t.Helper()
	disk := make([]byte, 1<<20)
	copy(disk, markerBootCode())
	p := filepath.Join(t.TempDir(), "disk.raw")
	if err := os.WriteFile(p, disk, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// markerCD writes an ISO 9660 image whose El Torito no-emulation boot image
// (loaded at 0000:7C00) is markerDisk's boot code: a bootable CD that is
// not drive 0x80.
func markerCD(t *testing.T) string {
	t.Helper()
	netnstest.RequireCommand(t, "xorriso")
	dir := t.TempDir()
	root := filepath.Join(dir, "root")
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	img := make([]byte, 2048)
	copy(img, markerBootCode())
	if err := os.WriteFile(filepath.Join(root, "boot.bin"), img, 0o644); err != nil {
		t.Fatal(err)
	}
	iso := filepath.Join(dir, "marker.iso")
	if out, err := exec.Command("xorriso", "-as", "mkisofs", "-quiet", "-b", "boot.bin", "-no-emul-boot", "-boot-load-size", "4",
		"-o", iso, root).CombinedOutput(); err != nil {
		t.Fatalf("xorriso: %v\n%s", err, out)
	}
	return iso
}

// markerBootCode is a 512-byte boot sector that writes diskMarker to COM1
// and halts.
func markerBootCode() []byte {
	code := []byte{
		0xFA,       // 00 cli
		0x31, 0xC0, // 01 xor ax,ax
		0x8E, 0xD8, // 03 mov ds,ax
		0xBE, 0x1A, 0x7C, // 05 mov si,0x7C1A (the message)
		0xBA, 0xF8, 0x03, // 08 mov dx,0x3F8
		0xAC,       // 0B lodsb
		0x84, 0xC0, // 0C test al,al
		0x74, 0x03, // 0E jz 0x13
		0xEE,       // 10 out dx,al
		0xEB, 0xF8, // 11 jmp 0x0B
		0xF4,       // 13 hlt
		0xEB, 0xFD, // 14 jmp 0x13
		0x90, 0x90, 0x90, 0x90, // 16 pad to 0x1A
	}
	mbr := make([]byte, 512)
	copy(mbr, code)
	copy(mbr[len(code):], diskMarker+"\r\n\x00")
	mbr[510], mbr[511] = 0x55, 0xAA
	return mbr
}

// noMoreScripts fails if the machine asked for its script again: after a
// "boot from disk" answer the chain wrapper must leave iPXE, not retry.
func noMoreScripts(t *testing.T, l *lab, console func() string) {
	t.Helper()
	for {
		select {
		case r := <-l.requests:
			if strings.HasPrefix(r, "/boot/ipxe") {
				t.Fatalf("script requested again (%s) after the boot-from-disk answer; console:\n%s", r, console())
			}
		default:
			if strings.Contains(console(), "boot script not available") {
				t.Fatalf("chain wrapper took the boot-from-disk answer for a missing script; console:\n%s", console())
			}
			return
		}
	}
}

// TestQEMUBIOSDeployedBootsDisk boots a deployed machine whose boot order
// puts the network first (SeaBIOS -boot order=nc, as a libvirt-backed BMC
// leaves it): iPXE gets the chain script, then the deployed script, and the
// machine must run its disk's boot code (through sanboot --no-describe, or
// iPXE's exit and SeaBIOS's next boot device), never fetching its script
// again.
func TestQEMUBIOSDeployedBootsDisk(t *testing.T) {
	l := newLab(t, boot.LifecycleDeployed)
	disk := markerDisk(t)
	lines, console := runVM(t, l, "-machine", "pc,graphics=off", "-boot", "order=nc",
		"-drive", "file="+disk+",format=raw,if=none,id=d0", "-device", "virtio-blk-pci,drive=d0",
		"-device", "virtio-net-pci,netdev=n0,mac="+labMAC)
	start := time.Now()
	waitRequest(t, l, "/boot/ipxe?mac=", 120*time.Second, console)
	waitSerial(t, lines, console, "Machina: "+labMAC+" (vm1) lifecycle=deployed platform=pcbios", 60*time.Second)
	waitSerial(t, lines, console, diskMarker, 60*time.Second)
	t.Logf("BIOS, network first: deployed script → disk boot code in %v", time.Since(start).Round(time.Millisecond))
	noMoreScripts(t, l, console)
}

// TestQEMUBIOSDeployedNoDisk0x80 is the fallback: a deployed machine
// booting network first whose BIOS has no INT 13h drive 0x80 (here: no hard
// disk, the next boot device a CD), so `sanboot --drive 0x80` fails. The
// script must then exit, the chain wrapper end iPXE, and SeaBIOS boot its
// next device (INT 18h), never fetching the script again.
func TestQEMUBIOSDeployedNoDisk0x80(t *testing.T) {
	l := newLab(t, boot.LifecycleDeployed)
	cd := markerCD(t)
	lines, console := runVM(t, l, "-machine", "pc,graphics=off", "-boot", "order=nd",
		"-drive", "file="+cd+",format=raw,media=cdrom,readonly=on",
		"-device", "virtio-net-pci,netdev=n0,mac="+labMAC)
	start := time.Now()
	waitRequest(t, l, "/boot/ipxe?mac=", 120*time.Second, console)
	waitSerial(t, lines, console, "Machina: "+labMAC+" (vm1) lifecycle=deployed platform=pcbios", 60*time.Second)
	waitSerial(t, lines, console, "Machina: leaving iPXE", 30*time.Second)
	waitSerial(t, lines, console, diskMarker, 60*time.Second)
	t.Logf("BIOS, network first, no drive 0x80: deployed script → exit → next boot device in %v", time.Since(start).Round(time.Millisecond))
	noMoreScripts(t, l, console)
}

// TestQEMUUEFIDeployedLeavesIPXE boots a deployed OVMF machine whose boot
// order puts its NIC first (bootindex 1, the disk 2): after the deployed
// script iPXE must end with an error status, so that EDK2's boot manager
// goes on through BootOrder (on EFI_SUCCESS it opens its menu, UiApp,
// instead), and the chain wrapper must never retry. OVMF lists the NIC
// more than once (the iPXE ROM's entry, its own PXEv4 that loads
// snponly.efi, PXEv6, HTTPv4, HTTPv6): iPXE runs and leaves once per IPv4
// entry, and the boot manager reaching the PXEv6 entry proves it went on.
// (The IPv6 and HTTP entries then time out before the disk's entry, about
// a minute each under TCG, as on real UEFI servers that have them
// enabled; the test stops at PXEv6.)
func TestQEMUUEFIDeployedLeavesIPXE(t *testing.T) {
	l := newLab(t, boot.LifecycleDeployed)
	code, myVars := ovmf(t)
	disk := markerDisk(t)
	lines, console := runVM(t, l, "-machine", "q35",
		"-drive", "if=pflash,format=raw,readonly=on,file="+code, "-drive", "if=pflash,format=raw,file="+myVars,
		"-drive", "file="+disk+",format=raw,if=none,id=d0", "-device", "virtio-blk-pci,drive=d0,bootindex=2",
		"-device", "virtio-net-pci,netdev=n0,mac="+labMAC+",bootindex=1")
	start := time.Now()
	waitSerial(t, lines, console, "Machina: "+labMAC+" (vm1) lifecycle=deployed platform=efi", 240*time.Second)
	waitSerial(t, lines, console, "Machina: leaving iPXE", 30*time.Second)
	waitSerial(t, lines, console, "Start PXE over IPv6", 240*time.Second)
	t.Logf("UEFI, network first: deployed script → iPXE left → boot manager's next entries in %v", time.Since(start).Round(time.Millisecond))
	con := console()
	if strings.Contains(con, "boot script not available") {
		t.Fatalf("chain wrapper took the boot-from-disk answer for a missing script; console:\n%s", con)
	}
	if n, left := strings.Count(con, "lifecycle=deployed platform=efi"), strings.Count(con, "Machina: leaving iPXE"); n != 2 || left != 2 {
		t.Fatalf("deployed script ran %d times and iPXE left %d times, want 2 and 2 (once per IPv4 network entry); console:\n%s", n, left, con)
	}
}
