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
