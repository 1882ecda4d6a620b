package boot

import (
	"fmt"
	"net"
	"strings"
)

// ParseMAC parses a 48-bit MAC in any of the forms seen at the boot
// boundaries and returns it in canonical form (6 bytes). Accepted:
// "52:54:00:12:34:56", "52-54-00-12-34-56" (iPXE ${net0/mac:hexhyp}, PXELINUX
// "01-" paths use ParseMAC after stripping the hardware type),
// "5254.0012.3456" and "525400123456", any letter case. It returns an error
// wrapping [ErrInvalidMAC] for anything else, including the all-zero address
// and group (multicast/broadcast) addresses, whose low bit of the first octet
// is set (IEEE 802-2014 §8.2).
func ParseMAC(s string) (net.HardwareAddr, error) {
	if len(s) > 17 {
		return nil, fmt.Errorf("parse mac: %w: too long", ErrInvalidMAC)
	}
	var hex string
	switch {
	case len(s) == 12:
		hex = s
	case len(s) == 17 && (strings.Count(s, ":") == 5 || strings.Count(s, "-") == 5):
		sep := s[2]
		for i := 2; i < 17; i += 3 {
			if s[i] != sep {
				return nil, fmt.Errorf("parse mac: %w: mixed separators", ErrInvalidMAC)
			}
		}
		hex = s[0:2] + s[3:5] + s[6:8] + s[9:11] + s[12:14] + s[15:17]
	case len(s) == 14 && s[4] == '.' && s[9] == '.':
		hex = s[0:4] + s[5:9] + s[10:14]
	default:
		return nil, fmt.Errorf("parse mac: %w: %q is not a 48-bit mac", ErrInvalidMAC, truncate(s))
	}
	if len(hex) != 12 {
		return nil, fmt.Errorf("parse mac: %w: %q", ErrInvalidMAC, truncate(s))
	}
	mac := make(net.HardwareAddr, 6)
	for i := 0; i < 6; i++ {
		hi, ok1 := unhex(hex[2*i])
		lo, ok2 := unhex(hex[2*i+1])
		if !ok1 || !ok2 {
			return nil, fmt.Errorf("parse mac: %w: %q has a non-hex digit", ErrInvalidMAC, truncate(s))
		}
		mac[i] = hi<<4 | lo
	}
	if err := CheckMAC(mac); err != nil {
		return nil, fmt.Errorf("parse mac: %w", err)
	}
	return mac, nil
}

// CheckMAC returns an error wrapping [ErrInvalidMAC] unless mac is a 48-bit,
// non-zero, individual (unicast) address. Use it on MACs taken from binary
// protocols (DHCP chaddr), where no parsing happens.
func CheckMAC(mac net.HardwareAddr) error {
	if len(mac) != 6 {
		return fmt.Errorf("%w: length %d, want 6", ErrInvalidMAC, len(mac))
	}
	if mac[0]&1 == 1 {
		return fmt.Errorf("%w: %s is a group (multicast) address", ErrInvalidMAC, mac)
	}
	zero := true
	for _, b := range mac {
		if b != 0 {
			zero = false
		}
	}
	if zero {
		return fmt.Errorf("%w: all-zero address", ErrInvalidMAC)
	}
	return nil
}

// FormatMAC returns the canonical text form: lower-case, colon-separated
// ("52:54:00:12:34:56"), which is what net.HardwareAddr.String gives for 6 bytes.
func FormatMAC(mac net.HardwareAddr) string { return mac.String() }

// NormalizeMAC parses s with [ParseMAC] and returns its canonical text form.
func NormalizeMAC(s string) (string, error) {
	mac, err := ParseMAC(s)
	if err != nil {
		return "", err
	}
	return mac.String(), nil
}

func unhex(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// truncate bounds untrusted input quoted in errors.
func truncate(s string) string {
	if len(s) > 20 {
		return s[:20] + "..."
	}
	return s
}
