// Package macaddr is the one place Machina parses, checks and prints a MAC
// address. Every boundary where a MAC enters as text uses it: the inventory
// schema's "mac" format and the inventory's normalisation, the state store,
// the boot servers (iPXE query strings, PXELINUX paths, DHCP chaddr), the
// discovery importer and the Redfish decoder.
//
// A [MAC] is a 48-bit (EUI-48) address held by value: comparable, usable as
// a map key, its zero value the all-zero address. Its text form is the
// canonical one everywhere in Machina, lower-case and colon-separated
// ("52:54:00:ab:cd:ef"), which is also what [net.HardwareAddr.String] prints
// for 6 bytes, so strings already stored in that form stay valid.
//
// macaddr is a leaf: it imports the standard library only
// (docs/architecture.md).
package macaddr

import (
	"errors"
	"fmt"
	"net"
	"strings"
)

// ErrInvalid is wrapped by every error of this package: the text is not a
// 48-bit MAC in an accepted notation, or (for [ParseUnicast] and [Check]) it
// is the all-zero or a group address.
var ErrInvalid = errors.New("invalid mac")

// MAC is an EUI-48 address. The zero value is 00:00:00:00:00:00.
type MAC [6]byte

// Parse reads a 48-bit MAC in any notation seen at Machina's boundaries, in
// any letter case, and returns it. Accepted:
//   - "52:54:00:12:34:56" (colons; inventory, Redfish MACAddress),
//   - "52-54-00-12-34-56" (hyphens; iPXE ${net0/mac:hexhyp}, PXELINUX "01-"
//     paths once the hardware type is stripped),
//   - "5254.0012.3456" (Cisco dotted),
//   - "525400123456" (bare hex; CSV imports).
//
// These are exactly the 6-byte forms [net.ParseMAC] reads plus the bare
// form. Mixed separators, other lengths (EUI-64, InfiniBand) and surrounding
// white space are refused with an error wrapping [ErrInvalid]. Parse does not
// refuse the all-zero or group addresses: use [ParseUnicast] where the MAC
// must name one NIC on the wire.
func Parse(s string) (MAC, error) {
	if len(s) > 17 {
		return MAC{}, fmt.Errorf("parse mac: %w: %q is too long", ErrInvalid, truncate(s))
	}
	var hex string
	switch {
	case len(s) == 12:
		hex = s
	case len(s) == 17 && (strings.Count(s, ":") == 5 || strings.Count(s, "-") == 5):
		sep := s[2]
		for i := 2; i < 17; i += 3 {
			if s[i] != sep {
				return MAC{}, fmt.Errorf("parse mac: %w: %q mixes separators", ErrInvalid, s)
			}
		}
		hex = s[0:2] + s[3:5] + s[6:8] + s[9:11] + s[12:14] + s[15:17]
	case len(s) == 14 && s[4] == '.' && s[9] == '.':
		hex = s[0:4] + s[5:9] + s[10:14]
	default:
		return MAC{}, fmt.Errorf("parse mac: %w: %q is not a 48-bit mac", ErrInvalid, truncate(s))
	}
	if len(hex) != 12 {
		return MAC{}, fmt.Errorf("parse mac: %w: %q", ErrInvalid, truncate(s))
	}
	var m MAC
	for i := range m {
		hi, ok1 := unhex(hex[2*i])
		lo, ok2 := unhex(hex[2*i+1])
		if !ok1 || !ok2 {
			return MAC{}, fmt.Errorf("parse mac: %w: %q has a non-hex digit", ErrInvalid, truncate(s))
		}
		m[i] = hi<<4 | lo
	}
	return m, nil
}

// ParseUnicast is [Parse] followed by [MAC.CheckUnicast]: the rule for MACs
// that a machine presents on the provisioning network (boot requests, tokens,
// auto-enrolment).
func ParseUnicast(s string) (MAC, error) {
	m, err := Parse(s)
	if err != nil {
		return MAC{}, err
	}
	if err := m.CheckUnicast(); err != nil {
		return MAC{}, fmt.Errorf("parse mac: %w", err)
	}
	return m, nil
}

// Normalize returns s ([Parse] rules) in canonical text form.
func Normalize(s string) (string, error) {
	m, err := Parse(s)
	if err != nil {
		return "", err
	}
	return m.String(), nil
}

// FromHardwareAddr converts a binary MAC (DHCP chaddr, a NIC's address). It
// returns an error wrapping [ErrInvalid] unless hw has 6 bytes.
func FromHardwareAddr(hw net.HardwareAddr) (MAC, error) {
	if len(hw) != 6 {
		return MAC{}, fmt.Errorf("%w: length %d, want 6", ErrInvalid, len(hw))
	}
	return MAC(hw), nil
}

// Check returns an error wrapping [ErrInvalid] unless hw is a 48-bit,
// non-zero, individual (unicast) address. Use it on MACs taken from binary
// protocols (DHCP chaddr), where no parsing happens.
func Check(hw net.HardwareAddr) error {
	m, err := FromHardwareAddr(hw)
	if err != nil {
		return err
	}
	return m.CheckUnicast()
}

// CheckUnicast returns an error wrapping [ErrInvalid] if m is the all-zero
// address or a group (multicast or broadcast) address, whose low bit of the
// first octet, the I/G bit, is set (IEEE 802-2014 §8.2).
func (m MAC) CheckUnicast() error {
	switch {
	case m.IsGroup():
		return fmt.Errorf("%w: %s is a group (multicast) address", ErrInvalid, m)
	case m.IsZero():
		return fmt.Errorf("%w: all-zero address", ErrInvalid)
	}
	return nil
}

// IsZero reports whether m is 00:00:00:00:00:00 (also the zero value: "no MAC").
func (m MAC) IsZero() bool { return m == MAC{} }

// IsGroup reports whether the I/G bit is set: a multicast or broadcast
// address, never one NIC's (IEEE 802-2014 §8.2).
func (m MAC) IsGroup() bool { return m[0]&1 == 1 }

// String returns the canonical form: lower-case hex, colon-separated.
func (m MAC) String() string { return net.HardwareAddr(m[:]).String() }

// HardwareAddr returns a new 6-byte slice holding m.
func (m MAC) HardwareAddr() net.HardwareAddr { return net.HardwareAddr(m[:]) }

// MarshalText returns the canonical form (encoding.TextMarshaler), so a MAC
// encodes as a JSON or YAML string.
func (m MAC) MarshalText() ([]byte, error) { return []byte(m.String()), nil }

// UnmarshalText parses b with [Parse] rules (encoding.TextUnmarshaler).
func (m *MAC) UnmarshalText(b []byte) error {
	v, err := Parse(string(b))
	if err != nil {
		return err
	}
	*m = v
	return nil
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
