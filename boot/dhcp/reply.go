package dhcp

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/iana"
	"github.com/machina-metal/machina/boot"
)

// Client system architecture types (DHCP option 93, RFC 4578 §2.1 and the
// IANA "Processor Architecture Types" registry).
const (
	ArchBIOS      = 0  // Intel x86PC (legacy BIOS PXE)
	ArchEFIBC     = 7  // x64 UEFI in the IANA registry ("EFI BC" in RFC 4578); sent by OVMF and most x86-64 firmwares
	ArchEFIx64    = 9  // "EFI x86-64" in RFC 4578 (EBC in the IANA registry); sent by some other x86-64 firmwares
	ArchEFIARM64  = 11 // ARM 64-bit UEFI
	ArchHTTPx64   = 16 // x64 UEFI HTTP boot
	ArchHTTPARM64 = 19 // ARM 64-bit UEFI HTTP boot
)

// BootFiles maps client architectures to what they boot. Zero values are
// documented per field; [Config] fills them.
type BootFiles struct {
	// BIOS is the TFTP file for arch 0. Zero: "undionly.kpxe".
	BIOS string
	// UEFI is the TFTP file for arch 7 and 9 (both, or some firmwares loop
	// forever). Zero: "snponly.efi" (uses the firmware's own NIC driver).
	UEFI string
	// ARM64 is the TFTP file for arch 11. Zero: "grubnetaa64.efi"
	// ([boot.GRUBImageARM64]: Debian ships no arm64 iPXE, so arm64 machines
	// boot through GRUB's network image; see boot/grub.go).
	ARM64 string
	// HTTPx64 and HTTPARM64 are the URLs sent to UEFI HTTP boot clients
	// (arch 16 and 19), together with option 60 "HTTPClient" (UEFI 2.5+
	// §24.7). Zero: no answer to HTTP boot clients.
	HTTPx64, HTTPARM64 string
	// Shim is the TFTP file for a Secure Boot server's x64 UEFI PXE client
	// (arch 7 and 9; [boot.Assignment.SecureBoot]). Zero: "shimx64.efi"
	// ([boot.ShimImageX64]).
	Shim string
	// ScriptURL is the HTTP URL of the iPXE script, given to clients whose
	// user class (option 77) is "iPXE", which breaks the chainload loop.
	// Required.
	ScriptURL string
}

func (b *BootFiles) setDefaults() {
	if b.BIOS == "" {
		b.BIOS = "undionly.kpxe"
	}
	if b.UEFI == "" {
		b.UEFI = "snponly.efi"
	}
	if b.ARM64 == "" {
		b.ARM64 = boot.GRUBImageARM64
	}
	if b.Shim == "" {
		b.Shim = boot.ShimImageX64
	}
}

// Boot is the boot answer chosen for one client.
type Boot struct {
	// File goes into the BOOTP file field and option 67.
	File string
	// HTTPClient is set for UEFI HTTP boot clients: the reply carries
	// option 60 "HTTPClient".
	HTTPClient bool
	// IPXE is set when the client is iPXE (user class "iPXE").
	IPXE bool
}

// ClientKind classifies a request for boot purposes.
type ClientKind int

// Client kinds.
const (
	ClientPlain ClientKind = iota // no PXE, HTTP boot or iPXE markers: address only
	ClientPXE                     // option 60 starts with "PXEClient"
	ClientHTTP                    // option 60 starts with "HTTPClient"
	ClientIPXE                    // option 77 user class "iPXE"
)

// Classify returns what kind of boot client sent req.
func Classify(req *dhcpv4.DHCPv4) ClientKind {
	if isIPXE(req) {
		return ClientIPXE
	}
	vc := req.ClassIdentifier()
	switch {
	case strings.HasPrefix(vc, "PXEClient"):
		return ClientPXE
	case strings.HasPrefix(vc, "HTTPClient"):
		return ClientHTTP
	}
	return ClientPlain
}

func isIPXE(req *dhcpv4.DHCPv4) bool {
	raw := req.Options.Get(dhcpv4.OptionUserClassInformation)
	if raw == nil {
		return false
	}
	if bytes.Equal(raw, []byte("iPXE")) { // iPXE sends the bare string, not RFC 3004 form
		return true
	}
	for _, uc := range req.UserClass() {
		if uc == "iPXE" {
			return true
		}
	}
	return false
}

// Arch returns the first option 93 architecture of req, or ArchBIOS when the
// option is absent (pre-RFC 4578 PXE ROMs send none) and -1 when malformed.
func Arch(req *dhcpv4.DHCPv4) int {
	raw := req.Options.Get(dhcpv4.OptionClientSystemArchitectureType)
	if raw == nil {
		return ArchBIOS
	}
	a := req.ClientArch()
	if len(a) == 0 {
		return -1
	}
	return int(a[0])
}

// ErrNoBoot: the client's architecture has no boot file configured.
var ErrNoBoot = errors.New("no boot file for client architecture")

// SelectBoot picks the boot answer for req from f: iPXE clients get the
// script URL; other PXE clients the binary for their option 93 arch; HTTP
// boot clients the HTTP URL. Plain DHCP clients get the zero Boot and nil.
// It returns an error wrapping ErrNoBoot for an architecture with nothing
// configured.
func SelectBoot(req *dhcpv4.DHCPv4, f BootFiles) (Boot, error) {
	switch Classify(req) {
	case ClientIPXE:
		return Boot{File: f.ScriptURL, IPXE: true}, nil
	case ClientPlain:
		return Boot{}, nil
	case ClientHTTP:
		switch arch := Arch(req); arch {
		case ArchHTTPx64:
			if f.HTTPx64 != "" {
				return Boot{File: f.HTTPx64, HTTPClient: true}, nil
			}
		case ArchHTTPARM64:
			if f.HTTPARM64 != "" {
				return Boot{File: f.HTTPARM64, HTTPClient: true}, nil
			}
		}
		return Boot{}, fmt.Errorf("%w: HTTP client arch %d", ErrNoBoot, Arch(req))
	}
	switch arch := Arch(req); arch {
	case ArchBIOS:
		return Boot{File: f.BIOS}, nil
	case ArchEFIBC, ArchEFIx64:
		return Boot{File: f.UEFI}, nil
	case ArchEFIARM64:
		return Boot{File: f.ARM64}, nil
	default:
		return Boot{}, fmt.Errorf("%w: arch %d", ErrNoBoot, arch)
	}
}

// ErrSecureBoot: a Secure Boot server asked for something other than the
// signed shim (iPXE, BIOS PXE, UEFI HTTP boot, another architecture); it
// gets an address and no boot file. It wraps [ErrNoBoot].
var ErrSecureBoot = fmt.Errorf("%w: secure boot server gets only the signed shim over x64 UEFI PXE", ErrNoBoot)

// SelectSecureBoot picks the boot answer for a Secure Boot server
// ([boot.Assignment.SecureBoot]): its x64 UEFI PXE client (option 60
// PXEClient, option 93 arch 7 or 9) gets f.Shim; every other client,
// iPXE included, gets an error wrapping [ErrSecureBoot], so that no
// unsigned binary or iPXE script is ever offered to it. Firmware with
// Secure Boot on would refuse an unsigned iPXE, and a server whose
// firmware does run one (Secure Boot off although its profile asks for
// it) must not boot the ramdisk as if the chain were verified. A plain
// DHCP client (the ramdisk's agent) gets the zero Boot and nil.
func SelectSecureBoot(req *dhcpv4.DHCPv4, f BootFiles) (Boot, error) {
	switch Classify(req) {
	case ClientPlain:
		return Boot{}, nil
	case ClientPXE:
		if a := Arch(req); a == ArchEFIBC || a == ArchEFIx64 {
			return Boot{File: f.Shim}, nil
		}
	}
	return Boot{}, fmt.Errorf("%w (client kind %d, arch %d)", ErrSecureBoot, Classify(req), Arch(req))
}

// Network is the segment-wide answer data.
type Network struct {
	// ServerIP is option 54 (server identifier) and, for boot replies, siaddr
	// (next-server, the TFTP server).
	ServerIP netip.Addr
	// Mask is option 1; Router option 3 (omitted when zero); DNS option 6;
	// Domain option 15.
	Mask   net.IPMask
	Router netip.Addr
	DNS    []netip.Addr
	Domain string
}

// Decision is what the server decided to answer; [BuildReply] turns it into
// a packet without side effects.
type Decision struct {
	Type dhcpv4.MessageType // Offer, Ack or Nak
	// YourIP is yiaddr; zero for proxyDHCP, INFORM and NAK.
	YourIP netip.Addr
	// LeaseTime is option 51 (T1 = 1/2, T2 = 7/8 of it, options 58/59); zero
	// omits all three (proxyDHCP, INFORM).
	LeaseTime time.Duration
	Hostname  string // option 12 when not empty
	Boot      Boot
	// Proxy builds a proxyDHCP answer (PXE 2.1 §2.2.5): no address options,
	// option 60 "PXEClient" and option 43 discovery control = 8 (boot the
	// file named in this offer, no boot server discovery).
	Proxy bool
	// NoPXEDHCP adds iPXE's encapsulated option 175 with sub-option 176
	// (no-pxedhcp) = 1, so iPXE does not wait ~3 s for ProxyDHCP offers.
	NoPXEDHCP bool
	// Message is option 56 (NAK reason).
	Message string
}

// BuildReply returns the reply to req for d on network n. It is pure: no I/O,
// no clock. Relay agent information (82) and client identifier (61, RFC 6842)
// are copied from req; for PXE clients the client UUID (97) is copied too.
func BuildReply(req *dhcpv4.DHCPv4, n Network, d Decision) (*dhcpv4.DHCPv4, error) {
	if !n.ServerIP.Is4() {
		return nil, errors.New("build reply: server ip is not ipv4")
	}
	mods := []dhcpv4.Modifier{
		dhcpv4.WithMessageType(d.Type),
		dhcpv4.WithOption(dhcpv4.OptServerIdentifier(n.ServerIP.AsSlice())),
	}
	if d.Type == dhcpv4.MessageTypeNak {
		mods = append(mods, dhcpv4.WithYourIP(net.IPv4zero))
		if d.Message != "" {
			mods = append(mods, dhcpv4.WithOption(dhcpv4.OptMessage(d.Message)))
		}
		r, err := dhcpv4.NewReplyFromRequest(req, mods...)
		if err != nil {
			return nil, fmt.Errorf("build reply: %w", err)
		}
		r.ClientIPAddr = net.IPv4zero
		return r, nil
	}
	if d.YourIP.IsValid() {
		mods = append(mods, dhcpv4.WithYourIP(d.YourIP.AsSlice()))
	}
	if !d.Proxy {
		mods = append(mods, addressOptions(n, d)...)
	}
	if d.Boot.File != "" {
		mods = append(mods, bootOptions(req, n, d)...)
	}
	r, err := dhcpv4.NewReplyFromRequest(req, mods...)
	if err != nil {
		return nil, fmt.Errorf("build reply: %w", err)
	}
	if d.Boot.File != "" && len(d.Boot.File) < 128 {
		r.BootFileName = d.Boot.File
	}
	return r, nil
}

// addressOptions are a full-mode reply's address options: netmask,
// router, DNS, domain, host name and the lease times (T1 half, T2 seven
// eighths of the lease; RFC 2131 §4.4.5).
func addressOptions(n Network, d Decision) []dhcpv4.Modifier {
	var out []dhcpv4.Modifier
	if n.Mask != nil {
		out = append(out, dhcpv4.WithNetmask(n.Mask))
	}
	if n.Router.IsValid() {
		out = append(out, dhcpv4.WithOption(dhcpv4.OptRouter(n.Router.AsSlice())))
	}
	if len(n.DNS) > 0 {
		ips := make([]net.IP, len(n.DNS))
		for i, a := range n.DNS {
			ips[i] = a.AsSlice()
		}
		out = append(out, dhcpv4.WithOption(dhcpv4.OptDNS(ips...)))
	}
	if n.Domain != "" {
		out = append(out, dhcpv4.WithOption(dhcpv4.OptDomainName(n.Domain)))
	}
	if d.Hostname != "" {
		out = append(out, dhcpv4.WithOption(dhcpv4.OptHostName(d.Hostname)))
	}
	if d.LeaseTime > 0 {
		out = append(out,
			dhcpv4.WithOption(dhcpv4.OptIPAddressLeaseTime(d.LeaseTime)),
			dhcpv4.WithOption(dhcpv4.OptRenewTimeValue(d.LeaseTime/2)),
			dhcpv4.WithOption(dhcpv4.OptRebindingTimeValue(d.LeaseTime*7/8)),
		)
	}
	return out
}

// bootOptions are the boot options of a reply that names a boot file:
// next server and file, HTTPClient for UEFI HTTP boot, the PXE discovery
// control in proxy mode, iPXE's no-pxedhcp, and the client's UUID (option
// 97) echoed back as PXE clients expect.
func bootOptions(req *dhcpv4.DHCPv4, n Network, d Decision) []dhcpv4.Modifier {
	var out []dhcpv4.Modifier
	out = append(out,
		dhcpv4.WithServerIP(n.ServerIP.AsSlice()),
		dhcpv4.WithOption(dhcpv4.OptBootFileName(d.Boot.File)),
	)
	if d.Boot.HTTPClient {
		out = append(out, dhcpv4.WithOption(dhcpv4.OptClassIdentifier("HTTPClient")))
	}
	if d.Proxy {
		out = append(out,
			dhcpv4.WithOption(dhcpv4.OptClassIdentifier("PXEClient")),
			// option 43: PXE_DISCOVERY_CONTROL (6), length 1, value 8; END.
			dhcpv4.WithGeneric(dhcpv4.OptionVendorSpecificInformation, []byte{6, 1, 8, 255}),
		)
	}
	if d.NoPXEDHCP {
		// option 175 (iPXE encapsulated): sub-option 176 no-pxedhcp, length 1, value 1.
		out = append(out, dhcpv4.WithGeneric(dhcpv4.GenericOptionCode(175), []byte{176, 1, 1}))
	}
	if uuid := req.Options.Get(dhcpv4.OptionClientMachineIdentifier); uuid != nil {
		out = append(out, dhcpv4.WithGeneric(dhcpv4.OptionClientMachineIdentifier, uuid))
	}
	return out
}

// archName renders an option 93 value for logs.
func archName(a int) string {
	if a < 0 {
		return "malformed"
	}
	return iana.Arch(a).String()
}
