package boot

import (
	"fmt"
	"net/url"
)

// GRUB network boot for arm64 UEFI machines. Debian 12 ships no arm64 iPXE
// build (package ipxe is x86 only) and its ipxe source package is not on
// the mirrors Machina's build may use, so arm64 machines boot through
// GRUB's own network stack instead: the firmware's PXE (DHCP option 93 arch
// 11) loads `grubnetaa64.efi` (scripts/build-grub-arm64.sh, from Debian's
// grub-efi-arm64-bin) by TFTP; its embedded configuration sources
// [GRUBConfigName] from the same TFTP server, which chains to the
// controller's [GRUBScriptPath] with the boot NIC's MAC, the same per-machine
// script (and single-use token) as iPXE's /boot/ipxe, in GRUB's syntax.
const (
	// GRUBScriptPath is the controller path of the per-machine GRUB script.
	GRUBScriptPath = "/boot/grub"
	// GRUBConfigName is the file the GRUB image's embedded configuration
	// fetches from its TFTP server ((tftp)/machina-grub.cfg); the TFTP
	// server generates it from the controller's URL.
	GRUBConfigName = "machina-grub.cfg"
	// GRUBImageARM64 is the GRUB network image for arch 11 clients.
	GRUBImageARM64 = "grubnetaa64.efi"
)

// GRUBPath turns an http URL into GRUB's device-and-path form,
// "(http,HOST:PORT)/PATH?QUERY" (GRUB 2.06 net/http.c; the port form is in
// Debian's 2.06). GRUB has no TLS, so https is refused, as is any URL that
// fails [CheckURL].
func GRUBPath(u string) (string, error) {
	if err := CheckURL(u); err != nil {
		return "", fmt.Errorf("grub path: %w", err)
	}
	p, err := url.Parse(u)
	if err != nil {
		return "", fmt.Errorf("grub path: %w", err)
	}
	if p.Scheme != "http" {
		return "", fmt.Errorf("grub path %q: GRUB fetches over plain http only", truncate(u))
	}
	host := p.Host
	if p.Port() == "" {
		host += ":80"
	}
	path := p.EscapedPath()
	if path == "" {
		path = "/"
	}
	if p.RawQuery != "" {
		path += "?" + p.RawQuery
	}
	return "(http," + host + ")" + path, nil
}

// GRUBChainConfig returns the GRUB script served by TFTP as
// [GRUBConfigName]: it sources the controller's per-machine script at
// scriptURL (an http URL ending in [GRUBScriptPath]) with GRUB's
// ${net_default_mac}, ${grub_platform} (efi) and ${grub_cpu} (arm64). The
// path is double-quoted so that GRUB expands the variables but reads '?'
// and '&' literally (unquoted, '?' is a wildcard).
func GRUBChainConfig(scriptURL string) ([]byte, error) {
	dev, err := GRUBPath(scriptURL)
	if err != nil {
		return nil, fmt.Errorf("grub chain config: %w", err)
	}
	if u, _ := url.Parse(scriptURL); u.RawQuery != "" {
		return nil, fmt.Errorf("grub chain config: script URL %q has a query", truncate(scriptURL))
	}
	return fmt.Appendf(nil, `# Machina: fetch this machine's script from the controller.
echo "Machina: fetching %s"
source "%s?mac=${net_default_mac}&platform=${grub_platform}&arch=${grub_cpu}"
`, scriptURL, dev), nil
}
