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
	"bytes"
	"fmt"
	"path"
	"regexp"
	"strings"
	"text/template"

	"github.com/machina-metal/machina/boot"
)

// Platform is the firmware as iPXE reports it in ${platform}.
type Platform string

// Platforms. Only these two decide script shape: the UEFI kernel line needs
// `initrd=NAME` (the EFI stub loads the initrd by name, else the kernel panics
// with "VFS: Unable to mount root fs", LAB-NOTES §2.3) and local boot differs
// (BIOS: INT 13h drive 0x80 via sanboot; UEFI: exit back to the boot manager).
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
	// Controller is the controller's base URL (checked with boot.CheckURL).
	Controller string
	// KernelURL and InitrdURL locate the ramdisk (checked with boot.CheckURL).
	KernelURL, InitrdURL string
	// KernelArgs are extra kernel arguments (see [Config.KernelArgs]).
	KernelArgs string
	// Token is the single-use token for ramdisk lifecycles (the reusable
	// install token for installer boots); empty otherwise.
	Token string
	// Installer and InstallerImage switch a deploying server to the
	// distribution installer ([boot.Assignment.Installer]).
	Installer, InstallerImage string
}

var scriptTmpl = template.Must(template.New("ipxe").Parse(`#!ipxe
echo Machina: {{.MAC}}{{with .Name}} ({{.}}){{end}} lifecycle={{.Lifecycle}} platform={{.Platform}}
{{- if .Ramdisk}}
kernel {{.KernelURL}}{{if .EFI}} initrd={{.InitrdName}}{{end}} {{.Cmdline}}
initrd {{.InitrdURL}}
boot
{{- else if .EFI}}
echo Machina: booting from local disk (exit to firmware)
exit
{{- else}}
echo Machina: booting from local disk
sanboot --drive 0x80
{{- end}}
`))

// safeArgs is the character set allowed in KernelArgs and names: no '$'
// (iPXE setting expansion), no quotes, no whitespace other than ' '.
var safeArgs = regexp.MustCompile(`^[A-Za-z0-9 ._,:=/@+-]*$`)

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

// Render returns the iPXE script for p. Commissioning, deploying and the
// release wipe (ready with Wipe) boot the ramdisk with `machina.url`, `machina.mac`, `machina.mode` and
// `machina.token` on the kernel command line; every other lifecycle boots
// the local disk. It returns an error when a URL or argument would be unsafe
// to place in a script.
func Render(p ScriptParams) ([]byte, error) {
	if _, err := boot.ParseMAC(p.MAC); err != nil {
		return nil, fmt.Errorf("render ipxe script: %w", err)
	}
	if !safeArgs.MatchString(p.KernelArgs) || !safeArgs.MatchString(p.Name) || strings.ContainsAny(p.Name, " ") {
		return nil, fmt.Errorf("render ipxe script: unsafe characters in name or kernel args")
	}
	if p.Platform != PlatformBIOS && p.Platform != PlatformEFI {
		return nil, fmt.Errorf("render ipxe script: unknown platform %q", p.Platform)
	}
	mode := modeFor(p.Lifecycle, p.Wipe, p.Installer)
	if mode == PurposeInstall {
		return renderInstaller(p)
	}
	data := struct {
		ScriptParams
		Ramdisk, EFI bool
		InitrdName   string
		Cmdline      string
	}{ScriptParams: p, Ramdisk: mode != "", EFI: p.Platform == PlatformEFI}
	if data.Ramdisk {
		for _, u := range []string{p.Controller, p.KernelURL, p.InitrdURL} {
			if err := boot.CheckURL(u); err != nil {
				return nil, fmt.Errorf("render ipxe script: %w", err)
			}
		}
		if !safeArgs.MatchString(p.Token) || p.Token == "" || strings.Contains(p.Token, " ") {
			return nil, fmt.Errorf("render ipxe script: token missing or unsafe")
		}
		data.InitrdName = path.Base(strings.SplitN(p.InitrdURL, "?", 2)[0])
		var args []string
		if p.KernelArgs != "" {
			args = append(args, p.KernelArgs)
		}
		args = append(args, "machina.url="+p.Controller, "machina.mac="+p.MAC, "machina.mode="+mode, "machina.token="+p.Token)
		data.Cmdline = strings.Join(args, " ")
	}
	var b bytes.Buffer
	if err := scriptTmpl.Execute(&b, data); err != nil {
		return nil, fmt.Errorf("render ipxe script: %w", err)
	}
	return b.Bytes(), nil
}
