// Package ipxe renders the per-machine iPXE scripts Machina serves at
// `GET /boot/ipxe?mac=...` and gates the ramdisk's machine-facing endpoints
// with the single-use tokens those scripts hand out.
//
// It imports only boot: machine data comes through [boot.Lookup], tokens
// through [boot.Tokens], auto-enrolment through [boot.Enroller]. The api
// package mounts [Handler]. The virtual-media ISO is built by
// scripts/metal/build-ipxe-iso.sh (see `make ipxe-iso`).
package ipxe

import (
	"fmt"
	"path"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/machina-metal/machina/boot"
	"github.com/machina-metal/machina/macaddr"
)

// Platform is the firmware as iPXE reports it in ${platform}.
type Platform string

// Platforms. Only these two decide script shape: the UEFI kernel line needs
// `initrd=NAME` (the EFI stub loads the initrd by name, else the kernel panics
// with "VFS: Unable to mount root fs", LAB-NOTES §2.3) and local boot differs
// (BIOS: INT 13h drive 0x80 via sanboot, else exit; UEFI: exit back to the
// boot manager; see [boot.ChainScript] for how iPXE then ends).
const (
	PlatformBIOS Platform = "pcbios"
	PlatformEFI  Platform = "efi"
)

// Token purposes: a commissioning token is valid only for commissioning
// endpoints, a deploy token only for deploy endpoints.
const (
	PurposeCommission = "commission"
	PurposeDeploy     = "deploy"
	// PurposeWipe is the release wipe of a ready server ([boot.Assignment.Wipe]).
	PurposeWipe = "wipe"
)

// ScriptParams is everything a script depends on. Render is pure: the same
// params give the same bytes.
type ScriptParams struct {
	MAC       string // canonical MAC
	Name      string // inventory name, may be empty
	Lifecycle boot.Lifecycle
	// Wipe boots a ready server into the ramdisk's wipe mode ([boot.Assignment.Wipe]).
	Wipe     bool
	Platform Platform
	// Arch is the machine's architecture as its boot loader reports it
	// (iPXE's ${buildarch}: i386, x86_64, arm64; GRUB's ${grub_cpu}: arm64);
	// "" when not reported. Shown in the GRUB script's first line; the
	// handler has already chosen the ramdisk URLs and kernel arguments for
	// it, so it changes nothing else.
	Arch string
	// Controller is the controller's base URL (checked with boot.CheckURL).
	Controller string
	// KernelURL and InitrdURL locate the ramdisk (checked with boot.CheckURL).
	KernelURL, InitrdURL string
	// KernelPath and InitrdPath, when set, replace KernelURL and InitrdURL
	// in a GRUB script: paths on GRUB's root device (the TFTP server it
	// came from), for the Secure Boot chain's GRUB, which has no http.
	// Characters: A-Z a-z 0-9 and "/._-".
	KernelPath, InitrdPath string
	// KernelArgs are extra kernel arguments (see [Config.KernelArgs]).
	KernelArgs string
	// Token is the single-use token for ramdisk lifecycles (the reusable
	// install token for installer boots); empty otherwise.
	Token string
	// Installer and InstallerImage switch a deploying server to the
	// distribution installer ([boot.Assignment.Installer]).
	Installer, InstallerImage string
}

// safeArg reports whether s uses only the characters allowed in KernelArgs,
// names and tokens: A-Z a-z 0-9 and " ._,:=/@+-" (no '$', which iPXE
// expands, no quotes, no whitespace other than ' '). A table lookup per
// byte, not a regexp: it runs several times for every script of a boot
// storm.
func safeArg(s string) bool {
	for i := 0; i < len(s); i++ {
		if !argByte[s[i]] {
			return false
		}
	}
	return true
}

// argByte marks the bytes safeArg allows.
var argByte = func() (t [256]bool) {
	for c := 'a'; c <= 'z'; c++ {
		t[c], t[c-'a'+'A'] = true, true
	}
	for c := '0'; c <= '9'; c++ {
		t[c] = true
	}
	for _, c := range []byte(" ._,:=/@+-") {
		t[c] = true
	}
	return t
}()

// modeFor maps a lifecycle (and the wipe flag and installer) to the token
// purpose of its boot: a ramdisk mode, PurposeInstall, or "" for local boot.
func modeFor(l boot.Lifecycle, wipe bool, installer string) string {
	switch {
	case l == boot.LifecycleDeploying && installer != "":
		return PurposeInstall
	case l == boot.LifecycleCommissioning:
		return PurposeCommission
	case l == boot.LifecycleDeploying:
		return PurposeDeploy
	case l == boot.LifecycleReady && wipe:
		return PurposeWipe
	}
	return ""
}

// checkedURLs holds URLs [boot.CheckURL] accepted (at most
// checkedURLsMax): Render checks the same configured controller, kernel and
// initrd URLs for every script of a boot storm, and a url.Parse each was
// 7% of the script handler's CPU (BenchmarkBootScriptStore).
var (
	checkedURLs  sync.Map // string -> struct{}
	checkedCount atomic.Int32
)

const checkedURLsMax = 64

// checkURL is boot.CheckURL remembering what it accepted.
func checkURL(u string) error {
	if _, ok := checkedURLs.Load(u); ok {
		return nil
	}
	if err := boot.CheckURL(u); err != nil {
		return err
	}
	if checkedCount.Add(1) <= checkedURLsMax {
		checkedURLs.Store(u, struct{}{})
	}
	return nil
}

// Render returns the iPXE script for p. Commissioning, deploying and the
// release wipe (ready with Wipe) boot the ramdisk with `machina.url`, `machina.mac`, `machina.mode` and
// `machina.token` on the kernel command line; every other lifecycle boots
// the local disk. It returns an error when a URL or argument would be unsafe
// to place in a script.
func Render(p ScriptParams) ([]byte, error) { return render(p, false) }

// render is Render. configChecked skips what [New] has checked already and
// is the same for every script the handler serves: Controller, KernelURL,
// InitrdURL and KernelArgs (the handler's configuration), and MAC (the
// handler's own formatting of an address it parsed); the per-request
// fields (Name, Arch, Platform, Token) are checked always (a
// script of a boot storm checked the same four configured strings again).
func render(p ScriptParams, configChecked bool) ([]byte, error) {
	if !configChecked {
		if _, err := macaddr.ParseUnicast(p.MAC); err != nil {
			return nil, fmt.Errorf("render ipxe script: %w", err)
		}
		if !safeArg(p.KernelArgs) {
			return nil, fmt.Errorf("render ipxe script: kernel args %q: characters outside A-Za-z0-9 ._,:=/@+-", p.KernelArgs)
		}
	}
	if !safeArg(p.Name) || strings.ContainsAny(p.Name, " ") || !safeArg(p.Arch) || strings.ContainsAny(p.Arch, " ") {
		return nil, fmt.Errorf("render ipxe script: unsafe characters in name %q or arch %q", p.Name, p.Arch)
	}
	if p.Platform != PlatformBIOS && p.Platform != PlatformEFI {
		return nil, fmt.Errorf("render ipxe script: unknown platform %q", p.Platform)
	}
	mode := modeFor(p.Lifecycle, p.Wipe, p.Installer)
	if mode == PurposeInstall {
		return renderInstaller(p)
	}
	ramdisk, efi := mode != "", p.Platform == PlatformEFI
	if ramdisk {
		if !configChecked {
			for _, u := range []string{p.Controller, p.KernelURL, p.InitrdURL} {
				if err := checkURL(u); err != nil {
					return nil, fmt.Errorf("render ipxe script: %w", err)
				}
			}
		}
		if !safeArg(p.Token) || p.Token == "" || strings.Contains(p.Token, " ") {
			return nil, fmt.Errorf("render ipxe script: token missing or unsafe")
		}
	}
	// Written out rather than through text/template, and appended into one
	// buffer sized up front (one allocation): a boot storm renders a script
	// per machine, the template's reflection was most of the handler's
	// cost, and the string concatenations after it about a third of
	// Render's (BenchmarkScript). Every field was validated
	// above; the goldens in testdata/ pin the bytes.
	b := make([]byte, 0, 320+len(p.MAC)+len(p.Name)+len(p.KernelArgs)+len(p.Controller)+2*len(p.KernelURL)+2*len(p.InitrdURL)+len(p.Token))
	b = append(b, "#!ipxe\necho Machina: "...)
	b = append(b, p.MAC...)
	if p.Name != "" {
		b = append(append(append(b, " ("...), p.Name...), ')')
	}
	b = append(append(append(append(b, " lifecycle="...), p.Lifecycle...), " platform="...), p.Platform...)
	switch {
	case ramdisk:
		b = append(append(b, "\nkernel "...), p.KernelURL...)
		if efi {
			initrd, _, _ := strings.Cut(p.InitrdURL, "?")
			b = append(append(b, " initrd="...), path.Base(initrd)...)
		}
		b = append(b, ' ')
		if p.KernelArgs != "" {
			b = append(append(b, p.KernelArgs...), ' ')
		}
		b = append(append(b, "machina.url="...), p.Controller...)
		b = append(append(b, " machina.mac="...), p.MAC...)
		b = append(append(b, " machina.mode="...), mode...)
		b = append(append(b, " machina.token="...), p.Token...)
		b = append(append(append(b, "\ninitrd "...), p.InitrdURL...), "\nboot\n"...)
	case efi:
		// `exit` ends this script with success; the chain wrapper
		// (boot.ChainScript) then ends iPXE with an error status, so the
		// UEFI boot manager tries its next Boot#### entry.
		b = append(b, "\necho Machina: booting from local disk (exit to the firmware's next boot device)\nexit 0\n"...)
	default:
		// BIOS: boot the first hard disk's MBR through INT 13h. Without
		// --no-describe iPXE first tries to describe drive 0x80 as a SAN
		// disk (iBFT/aBFT) and fails for a local disk ("Could not
		// describe SAN devices"), which made this script fail and the
		// chain wrapper retry for ever. Where sanboot still fails (no
		// INT 13h drive 0x80, or a BIOS that refuses it), `exit 0` ends
		// the script and the chain wrapper ends iPXE: the BIOS boots its
		// next boot device (INT 18h).
		b = append(b, "\necho Machina: booting from local disk (drive 0x80, else the firmware's next boot device)\nsanboot --no-describe --drive 0x80 || exit 0\n"...)
	}
	return b, nil
}
