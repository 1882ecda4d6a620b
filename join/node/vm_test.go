package node_test

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
)

// The VM test boots Debian's kernel under qemu (TCG) with an initramfs
// holding busybox, this package's test binary and the bridge, veth and
// 802.1Q modules, and runs the netns network tests inside the guest, the
// VLAN test among them (built with the tag machina_vmguest, vlan_guest_test.go:
// it is not part of the host run). It covers 802.1Q VLANs on machines whose
// own kernel has no 8021q support (this one).

func needVMTools(t *testing.T) {
	t.Helper()
	peertest.Commands(t, "qemu-system-x86_64", "busybox", "cpio", "gzip", "modprobe", "go")
}

// kernelRoot returns an extracted Debian kernel package: MACHINA_KERNEL_ROOT,
// or what scripts/fetch-kernel.sh prints (it downloads once into out/).
func kernelRoot(t *testing.T) (root, kver string) {
	t.Helper()
	root = os.Getenv("MACHINA_KERNEL_ROOT")
	if root == "" {
		out, err := exec.Command("../../scripts/fetch-kernel.sh").Output()
		if err != nil {
			peertest.Missing(t, fmt.Sprintf("no Debian kernel package: scripts/fetch-kernel.sh: %v", err),
				"apt-get download access to the Debian mirror (scripts/fetch-kernel.sh), or set MACHINA_KERNEL_ROOT to an extracted linux-image package")
		}
		root = strings.TrimSpace(string(out))
	}
	mods, _ := filepath.Glob(filepath.Join(root, "lib", "modules", "*"))
	if len(mods) != 1 {
		t.Fatalf("%s: want one lib/modules/KVER, found %v", root, mods)
	}
	return root, filepath.Base(mods[0])
}

const vmInit = `#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mkdir -p /proc /sys /dev; mount -t proc proc /proc; mount -t sysfs sysfs /sys; mount -t devtmpfs devtmpfs /dev
mkdir -p /tmp /var/run; mount -t tmpfs tmpfs /tmp
for m in $(cat /modules.order); do insmod "/modules/$m" || echo "M11: insmod $m failed"; done
echo "M11: modules: $(cat /proc/modules | cut -d" " -f1 | tr "\n" " ")"
/node.test -test.run '^(TestApplyBridgeInNetns|TestApplyVLANNetworkInNetns|TestApplyReportsEveryStep)$' -test.v
echo "M11-RESULT: $?"
poweroff -f
`

func TestNetworksInVM(t *testing.T) {
	needVMTools(t)
	root, kver := kernelRoot(t)
	stage := t.TempDir()
	// Modules in load order, without duplicates.
	var order []string
	seen := map[string]bool{}
	for _, m := range []string{"8021q", "bridge", "veth"} {
		out, err := exec.Command("modprobe", "-d", root, "-S", kver, "--show-depends", m).Output()
		if err != nil {
			t.Fatalf("modprobe --show-depends %s: %v", m, err)
		}
		for _, line := range strings.Split(string(out), "\n") {
			f := strings.Fields(line)
			if len(f) < 2 || f[0] != "insmod" || seen[f[1]] {
				continue
			}
			seen[f[1]] = true
			data, err := os.ReadFile(f[1])
			if err != nil {
				t.Fatal(err)
			}
			name := filepath.Base(f[1])
			os.MkdirAll(filepath.Join(stage, "modules"), 0o755)
			if err := os.WriteFile(filepath.Join(stage, "modules", name), data, 0o644); err != nil {
				t.Fatal(err)
			}
			order = append(order, name)
		}
	}
	os.WriteFile(filepath.Join(stage, "modules.order"), []byte(strings.Join(order, "\n")+"\n"), 0o644)
	os.WriteFile(filepath.Join(stage, "init"), []byte(vmInit), 0o755)
	os.MkdirAll(filepath.Join(stage, "bin"), 0o755)
	bb, _ := exec.LookPath("busybox")
	data, err := os.ReadFile(bb)
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(stage, "bin", "busybox"), data, 0o755)
	build := exec.Command("go", "test", "-c", "-tags", "machina_vmguest", "-o", filepath.Join(stage, "node.test"), ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go test -c: %v\n%s", err, out)
	}
	initrd := filepath.Join(t.TempDir(), "initrd.gz")
	pack := exec.Command("sh", "-c", `find . | cpio -o -H newc --owner=0:0 2>/dev/null | gzip -1 > "$1"`, "sh", initrd)
	pack.Dir = stage
	if out, err := pack.CombinedOutput(); err != nil {
		t.Fatalf("cpio: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	qemu := exec.CommandContext(ctx, "qemu-system-x86_64", "-accel", "tcg", "-m", "512", "-smp", "2",
		"-nographic", "-no-reboot", "-nodefaults", "-serial", "stdio",
		"-kernel", filepath.Join(root, "boot", "vmlinuz-"+kver), "-initrd", initrd,
		"-append", "console=ttyS0 quiet panic=-1")
	var out bytes.Buffer
	qemu.Stdout, qemu.Stderr = &out, &out
	err = qemu.Run()
	log := out.String()
	if err != nil {
		t.Fatalf("qemu: %v\n%s", err, log)
	}
	for _, want := range []string{"--- PASS: TestApplyBridgeInNetns", "--- PASS: TestApplyVLANNetworkInNetns", "--- PASS: TestApplyReportsEveryStep", "M11-RESULT: 0"} {
		if !strings.Contains(log, want) {
			t.Fatalf("guest output lacks %q:\n%s", want, log)
		}
	}
	t.Logf("guest:\n%s", log)
}
