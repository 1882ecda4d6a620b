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
// (`GET /boot/grub`, arm64 UEFI, see [boot.GRUBScriptPath] for why).
const (
	DialectIPXE Dialect = iota
	DialectGRUB
)

// RenderGRUB returns p's script in GRUB's syntax: the same choice as
// [Render] (ramdisk with Machina's kernel arguments for commissioning,
// deploying and the release wipe; local disk otherwise), with GRUB's
// `linux`/`initrd` over http (GRUB 2.06 has no TLS: the kernel and initrd
// URLs must be http) and `exit` back to the firmware's boot manager for a
// local boot (GRUB only runs on UEFI here). Installer boots are refused:
// they are iPXE only. Every argument passes the same checks as Render's;
// the kernel line is not quoted, so no argument may hold a GRUB
// metacharacter, which safeArg already excludes ('$', quotes, ';', '|',
// '&', '<', '>', braces, '*', '?', '[', '#' and '\\' are all outside it).
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
