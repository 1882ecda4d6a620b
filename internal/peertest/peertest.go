// Package peertest is the one place that decides what a test does when a
// real protocol peer or tool it needs (ipmi_sim, qemu, chromium, root, ...)
// is missing: it FAILS naming the Debian package to install (or the command
// to run), so `make test` and CI never pass by skipping. The only way to
// skip is the explicitly named quick mode: SKIP_PEERS=1 in the environment
// (`make unit-quick` sets it) or `go test -short`.
//
// Test helpers only: no product package may import it (TestProductImportsNoTestHelper
// checks the binaries' dependency graph). Imports no Machina package.
package peertest

import (
	"fmt"
	"os"
	"os/exec"
	"sort"
	"strings"
	"testing"
)

// QuickEnv names the environment variable of the quick mode: "1" turns a
// missing peer into a skip.
const QuickEnv = "SKIP_PEERS"

// DepsScript is the script that installs every peer the tests use.
const DepsScript = "scripts/deps.sh"

// Packages maps each command the tests run as a peer or tool to the Debian 12
// package that ships it (dpkg -S). Every package named here is in
// scripts/deps.sh's list (TestPackagesInDepsScript).
var Packages = map[string]string{
	"blkid":               "util-linux",
	"busybox":             "busybox-static",
	"chromedriver":        "chromium-driver",
	"chromium":            "chromium",
	"cpio":                "cpio",
	"curl":                "curl",
	"debootstrap":         "debootstrap",
	"depmod":              "kmod",
	"dhclient":            "isc-dhcp-client",
	"dnsmasq":             "dnsmasq-base",
	"dpkg-deb":            "dpkg",
	"fsck.fat":            "dosfstools",
	"git":                 "git",
	"gzip":                "gzip",
	"ip":                  "iproute2",
	"ipmi_sim":            "openipmi",
	"ipmitool":            "ipmitool",
	"losetup":             "mount",
	"mcopy":               "mtools",
	"mformat":             "mtools",
	"mkfs.vfat":           "dosfstools",
	"modprobe":            "kmod",
	"mount":               "mount",
	"mtype":               "mtools",
	"openssl":             "openssl",
	"pvs":                 "lvm2",
	"qemu-img":            "qemu-utils",
	"qemu-system-x86_64":  "qemu-system-x86",
	"sfdisk":              "fdisk",
	"sbverify":            "sbsigntool",
	"sgdisk":              "gdisk",
	"sh":                  "dash",
	"sha256sum":           "coreutils",
	"socat":               "socat",
	"syslinux":            "syslinux",
	"tar":                 "tar",
	"tftp":                "tftp-hpa",
	"truncate":            "coreutils",
	"udhcpc":              "udhcpc",
	"umount":              "mount",
	"vgcreate":            "lvm2",
	"vgremove":            "lvm2",
	"xorriso":             "xorriso",
	"apt-get":             "apt",
	"tshark":              "tshark",
	"nginx":               "nginx-light",
	"etcd":                "etcd-server",
	"etcdctl":             "etcd-client",
	"dirname":             "coreutils",
	"id":                  "coreutils",
	"cat":                 "coreutils",
	"grep":                "grep",
	"dpkg-query":          "dpkg",
	"setpriv":             "util-linux",
	"prlimit":             "util-linux",
	"systemd-analyze":     "systemd",
	"qemu-system-aarch64": "qemu-system-arm",
	"grub-mkimage":        "grub-common",
	"promtool":            "prometheus",
	"swtpm":               "swtpm",
	"swtpm_setup":         "swtpm-tools",
	"swtpm_localca":       "swtpm-tools",
	"lldpd":               "lldpd",
	"lldpcli":             "lldpd",
	"cloud-init":          "cloud-init",
	"mdadm":               "mdadm",
	"lvm":                 "lvm2",
	"mkfs.ext4":           "e2fsprogs",
	"resize2fs":           "e2fsprogs",
	"debugfs":             "e2fsprogs",
	"dumpe2fs":            "e2fsprogs",
	"mkfs.xfs":            "xfsprogs",
	"xfs_growfs":          "xfsprogs",
	"mkswap":              "util-linux",
}

// FilePackages are Debian packages tests need a file of rather than a
// command (File names them): firmware, boot loaders, Python modules such
// as python3-pyghmi (internal/pyghmibmc's BMC class, under Debian's own
// python3 interpreter).
var FilePackages = []string{"ovmf", "ipxe", "python3", "python3-pyghmi", "shim-signed", "grub-efi-amd64-signed"}

// Quick reports whether the quick mode is on (SKIP_PEERS=1 or -short).
func Quick() bool {
	return os.Getenv(QuickEnv) == "1" || testing.Short()
}

// Missing ends t because what (e.g. "ipmi_sim not in PATH") is missing;
// install says how to get it (e.g. "the Debian package openipmi"). It fails
// t, or skips it in the quick mode. It does not return.
func Missing(t testing.TB, what, install string) {
	t.Helper()
	if Quick() {
		t.Skipf("%s; quick mode (%s=1 or -short) skips: install %s for the full run", what, QuickEnv, install)
	}
	t.Fatalf("%s: install %s (`%s` installs every test peer; `make unit-quick` is the quick mode that skips instead)", what, install, DepsScript)
}

// Command returns the path of the command name in PATH, or ends t naming
// its Debian package (from Packages). Go itself is named as the Go toolchain.
func Command(t testing.TB, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err == nil {
		return p
	}
	Missing(t, name+" not in PATH", install(name))
	return ""
}

// Commands is Command for several names; it reports every missing one at once.
func Commands(t testing.TB, names ...string) {
	t.Helper()
	var miss, debs, other []string
	seen := map[string]bool{}
	for _, n := range names {
		if _, err := exec.LookPath(n); err != nil {
			miss = append(miss, n)
			if p, ok := Packages[n]; ok {
				if !seen[p] {
					seen[p] = true
					debs = append(debs, p)
				}
			} else {
				other = append(other, install(n))
			}
		}
	}
	if len(miss) == 0 {
		return
	}
	switch len(debs) {
	case 0:
	case 1:
		other = append([]string{"the Debian package " + debs[0]}, other...)
	default:
		other = append([]string{"the Debian packages " + strings.Join(debs, " ")}, other...)
	}
	Missing(t, strings.Join(miss, ", ")+" not in PATH", strings.Join(other, ", "))
}

// File ends t when path does not exist, naming the Debian package pkg that
// ships it (e.g. /usr/share/OVMF/OVMF_CODE_4M.fd, package ovmf).
func File(t testing.TB, path, pkg string) {
	t.Helper()
	if _, err := os.Stat(path); err != nil {
		Missing(t, path+" missing", "the Debian package "+pkg)
	}
}

// Root ends t when the test does not run as root; why says what needs it
// (e.g. "network namespaces").
func Root(t testing.TB, why string) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if Quick() {
		t.Skipf("needs root (%s); quick mode (%s=1 or -short) skips", why, QuickEnv)
	}
	t.Fatalf("needs root (%s): run the suite as root (`sudo make test`); `make unit-quick` is the quick mode that skips instead", why)
}

// Slow ends t in the quick mode only: for long end-to-end tests that need
// no extra peer (why says what the test does).
func Slow(t testing.TB, why string) {
	t.Helper()
	if Quick() {
		t.Skipf("%s; skipped in the quick mode (%s=1 or -short)", why, QuickEnv)
	}
}

// install names what provides the command name.
func install(name string) string {
	if name == "go" {
		return "the Go toolchain (go.dev/dl; PATH must hold its bin/)"
	}
	if p, ok := Packages[name]; ok {
		return "the Debian package " + p
	}
	return fmt.Sprintf("the Debian package that ships %s (apt-file search bin/%s)", name, name)
}

// DebianPackages returns the distinct packages of Packages, sorted.
func DebianPackages() []string {
	seen := map[string]bool{}
	var out []string
	for _, p := range Packages {
		if !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	sort.Strings(out)
	return out
}
