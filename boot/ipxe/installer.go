package ipxe

import (
	"bytes"
	"fmt"
	"regexp"
	"strings"
	"text/template"

	"github.com/machina-metal/machina/boot"
)

// PurposeInstall is the token purpose of an installer boot: one reusable,
// short-lived token in the path of every installer URL (kernel, initrd,
// ISO or tree, user-data or kickstart). Its holder can read only the
// installer files and documents of its own server while it deploys.
const PurposeInstall = "install"

// Installer kinds ([boot.Assignment.Installer]).
const (
	InstallerAutoinstall = "autoinstall"
	InstallerKickstart   = "kickstart"
)

// InstallPrefix is the path under which the controller serves an installer
// boot's files, each URL carrying the install token:
//
//	InstallPrefix + TOKEN + "/tree/" + PATH     a file of the ISO (kernel, initrd; RHEL: the whole tree)
//	InstallPrefix + TOKEN + "/iso/" + IMAGE + ".iso"  the ISO itself (Ubuntu's casper url=)
//	InstallPrefix + TOKEN + "/nocloud/user-data"  (and meta-data, vendor-data) Ubuntu autoinstall
//	InstallPrefix + TOKEN + "/ks.cfg"             RHEL kickstart
const InstallPrefix = "/install/"

// InstallerBootFiles returns the kernel and initrd paths inside the ISO of
// an installer kind (Ubuntu live-server casper/, RHEL images/pxeboot/), or
// false for an unknown kind.
func InstallerBootFiles(kind string) (kernel, initrd string, ok bool) {
	switch kind {
	case InstallerAutoinstall:
		return "casper/vmlinuz", "casper/initrd", true
	case InstallerKickstart:
		return "images/pxeboot/vmlinuz", "images/pxeboot/initrd.img", true
	}
	return "", "", false
}

var safeImage = regexp.MustCompile(`^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?$`)

var installerTmpl = template.Must(template.New("installer").Parse(`#!ipxe
echo Machina: {{.MAC}}{{with .Name}} ({{.}}){{end}} lifecycle={{.Lifecycle}} platform={{.Platform}} installer={{.Installer}}
kernel {{.Base}}/tree/{{.Kernel}}{{if .EFI}} initrd={{.InitrdName}}{{end}} {{.Cmdline}}
initrd {{.Base}}/tree/{{.Initrd}}
boot
`))

// renderInstaller renders the installer boot of a deploying server: the
// installer's own kernel and initrd from the ISO, with its kernel
// arguments (Ubuntu: `ip=dhcp url=ISO autoinstall
// ds=nocloud-net;s=URL/nocloud/`, cloud-init's NoCloud seed over HTTP;
// RHEL: `ip=dhcp inst.stage2=TREE inst.repo=TREE inst.ks=URL/ks.cfg
// inst.text`). iPXE splits a command line on whitespace only and expands
// ${...}: the ';' of the NoCloud argument passes to the kernel unchanged
// (GRUB would need '\;'), and quoting it would break cloud-init, which
// looks for " ds=nocloud-net;" in /proc/cmdline. No URL here holds
// whitespace, '$' or quotes (boot.CheckURL, the token and image checks).
func renderInstaller(p ScriptParams) ([]byte, error) {
	kernel, initrd, ok := InstallerBootFiles(p.Installer)
	if !ok {
		return nil, fmt.Errorf("render ipxe script: unknown installer %q", p.Installer)
	}
	if !safeImage.MatchString(p.InstallerImage) {
		return nil, fmt.Errorf("render ipxe script: unsafe installer image name")
	}
	if err := boot.CheckURL(p.Controller); err != nil {
		return nil, fmt.Errorf("render ipxe script: %w", err)
	}
	if !safeArg(p.Token) || p.Token == "" || strings.ContainsAny(p.Token, " /") {
		return nil, fmt.Errorf("render ipxe script: token missing or unsafe")
	}
	base := strings.TrimRight(p.Controller, "/") + strings.TrimSuffix(InstallPrefix, "/") + "/" + p.Token
	var args []string
	if p.KernelArgs != "" {
		args = append(args, p.KernelArgs)
	}
	switch p.Installer {
	case InstallerAutoinstall:
		args = append(args, "ip=dhcp", "url="+base+"/iso/"+p.InstallerImage+".iso", "autoinstall", "ds=nocloud-net;s="+base+"/nocloud/")
	case InstallerKickstart:
		args = append(args, "ip=dhcp", "inst.stage2="+base+"/tree/", "inst.repo="+base+"/tree/", "inst.ks="+base+"/ks.cfg", "inst.text")
	}
	data := struct {
		ScriptParams
		EFI                              bool
		Base, Kernel, Initrd, InitrdName string
		Cmdline                          string
	}{ScriptParams: p, EFI: p.Platform == PlatformEFI, Base: base, Kernel: kernel, Initrd: initrd,
		InitrdName: initrd[strings.LastIndex(initrd, "/")+1:], Cmdline: strings.Join(args, " ")}
	var b bytes.Buffer
	if err := installerTmpl.Execute(&b, data); err != nil {
		return nil, fmt.Errorf("render ipxe script: %w", err)
	}
	return b.Bytes(), nil
}
