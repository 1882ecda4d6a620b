package ipxe

import (
	"fmt"
	"strings"

	"github.com/machina-metal/machina/boot"
	"github.com/machina-metal/machina/macaddr"
)

// localBootX64 is the local boot of an x86-64 UEFI server that came up
// through the Secure Boot chain (shim, GRUB): it never goes back to iPXE.
// GRUB finds the EFI system partition that holds the removable-media boot
// path \EFI\BOOT\BOOTX64.EFI (UEFI 2.x §3.5.1.1; the deployed image's
// shim, which its installer puts there) and chainloads it: under Secure
// Boot GRUB's chainloader has shim verify it (Microsoft-signed shim is in
// db), and that shim boots the disk's GRUB and kernel. A disk without one
// (nothing deployed, a foreign layout) falls back to `exit`: GRUB returns
// to shim and shim to the firmware's boot manager, which tries the next
// boot option (EDK2-derived firmware opens its menu when the option
// returned success, which GRUB 2.06's exit does).
const localBootX64 = `echo "Machina: booting from local disk (EFI system partition, \EFI\BOOT\BOOTX64.EFI)"
insmod part_gpt
insmod part_msdos
insmod fat
insmod chain
if search --no-floppy --file --set=machina_esp /EFI/BOOT/BOOTX64.EFI; then
	chainloader ($machina_esp)/EFI/BOOT/BOOTX64.EFI
	boot
fi
echo "Machina: no disk with \EFI\BOOT\BOOTX64.EFI found; exit to firmware"
exit
`

// Dialect is the boot loader a per-machine script is written for.
type Dialect int

// Dialects: iPXE (`GET /boot/ipxe`, x86 BIOS and UEFI) and GRUB
// (`GET /boot/grub` for arm64 UEFI, see [boot.GRUBScriptPath] for why, and
// the x86-64 Secure Boot chain's TFTP script, see [Handler.TFTPScript]).
const (
	DialectIPXE Dialect = iota
	DialectGRUB
)

// RenderGRUB returns p's per-machine script in GRUB's syntax, for the two
// GRUBs Machina boots: arm64 UEFI's grubnetaa64.efi, which fetches it over
// http from GET /boot/grub, and the x86-64 Secure Boot chain's signed GRUB
// (shim, then Debian's signed grubnetx64 as grubx64.efi), which fetches it
// by TFTP ([Handler.TFTPScript]).
// The choice is [Render]'s: the ramdisk with Machina's kernel arguments
// (machina.url, .mac, .mode, .token) for commissioning, deploying and the
// release wipe; the local disk otherwise. The ramdisk is loaded with
// `linux`/`initrd` from p.KernelPath and p.InitrdPath when both are set
// (paths on the TFTP server GRUB came from: the Secure Boot GRUB has no
// http), else from p.KernelURL and p.InitrdURL rewritten as (http,host)
// paths by [boot.GRUBPath] (GRUB 2.06 has no TLS, so those must be http).
// A local boot on x86_64 chainloads the disk's \EFI\BOOT\BOOTX64.EFI
// through shim (localBootX64), so a Secure Boot server stays in the
// signed chain; on other architectures it is `exit` back to the firmware's
// boot manager. Installer boots are refused: they are iPXE only.
//
// Errors: a MAC that is not unicast, a name, arch or kernel argument
// outside safeArg (the kernel line is not quoted, and safeArg excludes
// every GRUB metacharacter: '$', quotes, ';', '|', '&', '<', '>', braces,
// '*', '?', '[', '#' and '\\'), an installer boot, and for a ramdisk boot
// a controller URL [boot.CheckURL] refuses, kernel and initrd locations
// that are neither valid paths nor http URLs, and a missing or unsafe token.
func RenderGRUB(p ScriptParams) ([]byte, error) {
	if _, err := macaddr.ParseUnicast(p.MAC); err != nil {
		return nil, fmt.Errorf("render grub script: %w", err)
	}
	if !safeArg(p.KernelArgs) || !safeArg(p.Name) || strings.ContainsAny(p.Name, " ") || !safeArg(p.Arch) {
		return nil, fmt.Errorf("render grub script: unsafe characters in name, arch or kernel args")
	}
	mode := modeFor(p.Lifecycle, p.Wipe, p.Installer)
	if mode == PurposeInstall {
		return nil, fmt.Errorf("render grub script: installer boots (%s) need iPXE; deploy arm64 servers with deploy: image", p.Installer)
	}
	var b strings.Builder
	b.WriteString("echo \"Machina: " + p.MAC)
	if p.Name != "" {
		b.WriteString(" (" + p.Name + ")")
	}
	b.WriteString(" lifecycle=" + string(p.Lifecycle) + " platform=efi arch=" + p.Arch + "\"\n")
	if mode == "" {
		if p.Arch == "x86_64" {
			b.WriteString(localBootX64)
			return []byte(b.String()), nil
		}
		b.WriteString("echo \"Machina: booting from local disk (exit to firmware)\"\nexit\n")
		return []byte(b.String()), nil
	}
	if err := boot.CheckURL(p.Controller); err != nil {
		return nil, fmt.Errorf("render grub script: %w", err)
	}
	kernel, initrd := p.KernelPath, p.InitrdPath
	if kernel == "" || initrd == "" {
		var err error
		if kernel, err = boot.GRUBPath(p.KernelURL); err != nil {
			return nil, fmt.Errorf("render grub script: kernel: %w", err)
		}
		if initrd, err = boot.GRUBPath(p.InitrdURL); err != nil {
			return nil, fmt.Errorf("render grub script: initrd: %w", err)
		}
	} else if !devicePath(kernel) || !devicePath(initrd) {
		return nil, fmt.Errorf("render grub script: kernel or initrd path: characters outside A-Za-z0-9/._-")
	}
	if !safeArg(p.Token) || p.Token == "" || strings.Contains(p.Token, " ") {
		return nil, fmt.Errorf("render grub script: token missing or unsafe")
	}
	args := []string{}
	if p.KernelArgs != "" {
		args = append(args, p.KernelArgs)
	}
	args = append(args, "machina.url="+p.Controller, "machina.mac="+p.MAC, "machina.mode="+mode, "machina.token="+p.Token)
	b.WriteString("linux " + kernel + " " + strings.Join(args, " ") + "\n")
	b.WriteString("initrd " + initrd + "\nboot\n")
	return []byte(b.String()), nil
}

// devicePath reports whether s is a non-empty absolute path of
// A-Z a-z 0-9 and "/._-": nothing GRUB's parser would expand or split.
func devicePath(s string) bool {
	if len(s) < 2 || s[0] != '/' {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < 'a' || c > 'z') && (c < 'A' || c > 'Z') && (c < '0' || c > '9') && c != '/' && c != '.' && c != '_' && c != '-' {
			return false
		}
	}
	return true
}
