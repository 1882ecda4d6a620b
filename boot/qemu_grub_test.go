package boot_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/machina-metal/machina/boot"
	"github.com/machina-metal/machina/boot/dhcp"
	"github.com/machina-metal/machina/internal/peertest"
)

// TestQEMUARM64GRUBNetboot: an arm64 UEFI machine (qemu-system-aarch64
// virt, AAVMF, TCG) on the lab bridge network-boots through Machina's own
// servers: boot/dhcp answers its DHCP option 93 arch 11 with
// grubnetaa64.efi, boot/tftp serves that GRUB image (built by `make prep`:
// scripts/build-grub-arm64.sh) and the machina-grub.cfg it generates, GRUB
// GETs /boot/grub from the real script handler with its MAC and arch, and
// then asks for the arm64 ramdisk's kernel. (ramdisk/vmtest
// TestARM64NetbootCommissionInQemu takes the same chain on to the
// commissioning report.)
func TestQEMUARM64GRUBNetboot(t *testing.T) {
	peertest.Command(t, "qemu-system-aarch64")
	const code, vars = "/usr/share/AAVMF/AAVMF_CODE.fd", "/usr/share/AAVMF/AAVMF_VARS.fd"
	peertest.File(t, code, "qemu-efi-aarch64")
	peertest.File(t, vars, "qemu-efi-aarch64")
	imgPath := filepath.Join("..", "out", "boot", boot.GRUBImageARM64)
	img, err := os.ReadFile(imgPath)
	if err != nil {
		peertest.Missing(t, imgPath+" missing", "it with `make prep` (sh scripts/build-grub-arm64.sh)")
	}
	l := newLabMode(t, boot.LifecycleCommissioning, dhcp.BootFiles{}, dhcp.ModeFull, map[string][]byte{boot.GRUBImageARM64: img})
	b, err := os.ReadFile(vars)
	if err != nil {
		t.Fatal(err)
	}
	myVars := filepath.Join(t.TempDir(), "vars.fd")
	if err := os.WriteFile(myVars, b, 0o644); err != nil {
		t.Fatal(err)
	}
	lines, console := runVMWith(t, l, "qemu-system-aarch64", "-machine", "virt", "-cpu", "max",
		"-drive", "if=pflash,format=raw,readonly=on,file="+code, "-drive", "if=pflash,format=raw,file="+myVars,
		"-device", "virtio-net-pci,netdev=n0,mac="+labMAC+",romfile=")
	start := time.Now()
	req := waitRequest(t, l, boot.GRUBScriptPath+"?mac=", 300*time.Second, console)
	if !strings.Contains(req, "mac="+labMAC) || !strings.Contains(req, "arch=arm64") || !strings.Contains(req, "platform=efi") {
		t.Fatalf("GRUB's script request %q, want mac=%s, platform=efi, arch=arm64", req, labMAC)
	}
	// GRUB wraps its console at 80 columns: match the line's first part.
	waitSerial(t, lines, console, "Machina: "+labMAC+" (vm1) lifecycle=commissioning platform=efi", 60*time.Second)
	waitRequest(t, l, "/boot/ramdisk/arm64/vmlinuz", 120*time.Second, console)
	t.Logf("arm64 UEFI PXE: DHCP arch 11 → TFTP grubnetaa64.efi → machina-grub.cfg → /boot/grub → arm64 kernel request in %v", time.Since(start).Round(time.Millisecond))
	if st := l.tftp.Stats(); st.Served < 2 {
		t.Fatalf("tftp stats %+v: want the GRUB image and machina-grub.cfg served", st)
	}
}
