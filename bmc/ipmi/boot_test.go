package ipmi

import (
	"testing"

	"github.com/machina-metal/machina/bmc"
)

// TestEncodeBootFlags pins the parameter 5 data bytes (IPMI v2.0 table 28-14).
func TestEncodeBootFlags(t *testing.T) {
	cases := []struct {
		o          bmc.BootOverride
		currentEFI bool
		want       [5]byte
	}{
		{bmc.BootOverride{Device: bmc.BootPXE, Persistent: true, Mode: bmc.BootModeUEFI}, false, [5]byte{0xE0, 0x04}},
		{bmc.BootOverride{Device: bmc.BootPXE, Mode: bmc.BootModeUEFI}, false, [5]byte{0xA0, 0x04}},
		{bmc.BootOverride{Device: bmc.BootPXE, Persistent: true, Mode: bmc.BootModeLegacy}, true, [5]byte{0xC0, 0x04}},
		{bmc.BootOverride{Device: bmc.BootPXE, Mode: bmc.BootModeLegacy}, true, [5]byte{0x80, 0x04}},
		{bmc.BootOverride{Device: bmc.BootDisk, Mode: bmc.BootModeUEFI}, false, [5]byte{0xA0, 0x08}},
		{bmc.BootOverride{Device: bmc.BootCD, Persistent: true}, true, [5]byte{0xE0, 0x14}},
		{bmc.BootOverride{Device: bmc.BootBIOSSetup}, false, [5]byte{0x80, 0x18}},
	}
	for _, tc := range cases {
		got, err := EncodeBootFlags(tc.o, tc.currentEFI)
		if err != nil || got != tc.want {
			t.Errorf("EncodeBootFlags(%+v, efi=%v) = % X, %v; want % X", tc.o, tc.currentEFI, got, err, tc.want)
		}
	}
	if _, err := EncodeBootFlags(bmc.BootOverride{Device: "floppy"}, false); err == nil {
		t.Error("EncodeBootFlags(floppy) succeeded")
	}
	if _, err := EncodeBootFlags(bmc.BootOverride{Device: bmc.BootPXE, Mode: "efi2"}, false); err == nil {
		t.Error("EncodeBootFlags(mode efi2) succeeded")
	}
}

// FuzzDecodeBootFlags feeds arbitrary parameter 5 bytes (as a BMC may
// answer them): decoding never panics, and a decoded override with a device
// encodes back to the same selector and flag bits.
func FuzzDecodeBootFlags(f *testing.F) {
	f.Add([]byte{0xE0, 0x04, 0, 0, 0})
	f.Add([]byte{0x00, 0x08, 0, 0, 0})
	f.Add([]byte{0xFF, 0xFF, 0xFF, 0xFF, 0xFF})
	f.Fuzz(func(t *testing.T, data []byte) {
		var b [5]byte
		copy(b[:], data)
		o, valid := DecodeBootFlags(b)
		if o.Device == "" {
			return
		}
		enc, err := EncodeBootFlags(o, false)
		if err != nil {
			t.Fatalf("EncodeBootFlags(DecodeBootFlags(% X)) = %v", b, err)
		}
		if enc[1] != b[1]&selectorMask {
			t.Errorf("selector % X → %s → % X", b[1], o.Device, enc[1])
		}
		if m := bootFlagPersistent | bootFlagEFI; enc[0]&m != b[0]&m {
			t.Errorf("flags 0x%02X → %+v → 0x%02X", b[0], o, enc[0])
		}
		if valid != (b[0]&bootFlagValid != 0) {
			t.Errorf("valid = %v for byte 1 0x%02X", valid, b[0])
		}
	})
}

func TestSplitAddress(t *testing.T) {
	cases := []struct {
		in   string
		host string
		port int
		ok   bool
	}{
		{"10.0.0.5", "10.0.0.5", 623, true},
		{"10.0.0.5:6230", "10.0.0.5", 6230, true},
		{"bmc-1.example", "bmc-1.example", 623, true},
		{"[fd00::1]:624", "fd00::1", 624, true},
		{"fd00::1", "fd00::1", 623, true},
		{"[fd00::1]", "fd00::1", 623, true},
		{"", "", 0, false},
		{"host:0", "", 0, false},
		{"host:99999", "", 0, false},
		{"-oProxyCommand=x", "", 0, false},
		{"a b", "", 0, false},
		{"-H", "", 0, false},
	}
	for _, tc := range cases {
		h, p, err := splitAddress(tc.in)
		if (err == nil) != tc.ok || tc.ok && (h != tc.host || p != tc.port) {
			t.Errorf("splitAddress(%q) = %q, %d, %v; want %q, %d, ok=%v", tc.in, h, p, err, tc.host, tc.port, tc.ok)
		}
	}
}
