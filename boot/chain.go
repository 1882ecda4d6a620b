package boot

import (
	"fmt"
	"net/url"
	"strings"
)

// ChainScript returns the iPXE script that runs DHCP unless net0 already has
// an address (iPXE's autoboot got one: repeating it costs seconds), retrying
// until it gets one, and then chains to scriptURL with the boot NIC's MAC (iPXE's
// ${net0/mac:hexhyp}), firmware platform (${platform}: pcbios or efi) and
// build architecture (${buildarch}) as query parameters. TFTP serves it as
// `autoexec.ipxe` and the iPXE handler returns it when called without a MAC.
// scriptURL must pass [CheckURL].
//
// It tells two outcomes of `chain` apart:
//
//   - the machine's script could not be fetched or failed (HTTP error,
//     kernel download or boot failed): `chain` fails, and the script waits
//     5 s and tries again, for ever (the controller may be restarting);
//   - the machine's script returned (it ran `exit`: its answer is "boot from
//     disk", or the machine is unknown): `chain` succeeds, because iPXE's
//     `exit` inside a chained script ends only that script
//     (https://ipxe.org/cmd/exit). The wrapper then ends iPXE itself, once,
//     so the firmware boots its next boot device. It never retries then: a
//     machine whose boot order puts the network first (libvirt-backed BMCs,
//     servers whose BMC ignores or drops the boot override) would otherwise
//     network-boot for ever.
//
// How iPXE ends decides what the firmware does next. BIOS: iPXE returns to
// the BIOS (as a BBS boot-entry-vector ROM, or to the PXE ROM that loaded
// undionly.kpxe), which calls INT 18h, and SeaBIOS and vendor BIOSes boot
// the next device in their boot order (LAB-NOTES §6.1: SeaBIOS with
// `-boot order=nc`); the exit status is not looked at. UEFI: the boot
// manager looks at the status the boot option returns (UEFI 2.x §3.1.1): on
// EFI_SUCCESS, EDK2-derived firmware (OVMF, and vendor firmware built on
// its BdsDxe) stops processing BootOrder and opens the boot manager menu;
// on an error it tries the next Boot#### entry. So on UEFI the wrapper ends
// with `exit 1`, which iPXE returns as an EFI error status.
func ChainScript(scriptURL string) ([]byte, error) {
	if err := CheckURL(scriptURL); err != nil {
		return nil, fmt.Errorf("chain script: %w", err)
	}
	sep := "?"
	if strings.Contains(scriptURL, "?") {
		sep = "&"
	}
	return fmt.Appendf(nil, `#!ipxe
# Machina: get an address (retrying), then fetch this machine's script.
:retry
isset ${net0/ip} || dhcp || goto wait
chain --autofree %s%smac=${net0/mac:hexhyp}&platform=${platform}&arch=${buildarch} || goto wait
# The script returned: boot from disk. Leave iPXE for the next boot device
# (UEFI: with an error status, so the boot manager tries the next entry).
echo Machina: leaving iPXE for the firmware's next boot device
iseq ${platform} efi && exit 1 ||
exit 0
:wait
echo Machina: boot script not available, retrying in 5 s
sleep 5
goto retry
`, scriptURL, sep), nil
}

// CheckURL returns an error unless s is an absolute http or https URL with a
// host, no user info, no fragment, and no character that iPXE's script parser
// or a kernel command line would interpret: whitespace, control characters,
// '$' (setting expansion), quotes and backslashes. Use it on every URL before it
// goes into a script.
func CheckURL(s string) error {
	for _, r := range s {
		if r <= ' ' || r == 0x7f || r == '$' || r == '"' || r == '\'' || r == '\\' || r > 0x7e {
			return fmt.Errorf("url %q: contains %q", truncate(s), r)
		}
	}
	u, err := url.Parse(s)
	if err != nil {
		return fmt.Errorf("url: %w", err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil || u.Fragment != "" {
		return fmt.Errorf("url %q: want http(s)://host/path without user info or fragment", truncate(s))
	}
	return nil
}

// truncate bounds untrusted input quoted in errors.
func truncate(s string) string {
	if len(s) > 20 {
		return s[:20] + "..."
	}
	return s
}
