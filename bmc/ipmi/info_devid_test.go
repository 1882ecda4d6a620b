package ipmi

import "testing"

// TestDeviceIDFirmwareWithoutAux: Get Device ID answers of 11 to 15 data
// bytes (IPMI v2.0 section 20.1: the Auxiliary Firmware Revision, bytes
// 12-15, is optional; BMCs and emulators answer without it or with part of
// it) all give the firmware revision. The minor revision is BCD and prints
// as its two digits (0x45 → "45"), as ipmitool's "mc info" prints it.
// Before, the driver used go-ipmi's decoder, which rejects 12-14 bytes, and
// Info listed firmware as missing.
func TestDeviceIDFirmwareWithoutAux(t *testing.T) {
	// Device ID 20h, revision 01h, firmware 2.45, IPMI 2.0, support bits,
	// manufacturer 000157h, product 0B0Ch.
	mandatory := []byte{0x20, 0x01, 0x02, 0x45, 0x02, 0xbf, 0x57, 0x01, 0x00, 0x0c, 0x0b}
	for n := 11; n <= 15; n++ {
		data := append(append([]byte(nil), mandatory...), []byte{0x00, 0x00, 0x00, 0x00}[:n-11]...)
		got, err := deviceIDFirmware(data)
		if err != nil || got != "2.45" {
			t.Errorf("deviceIDFirmware(%d bytes) = %q, %v; want 2.45", n, got, err)
		}
	}
	// Bit 7 of the major revision is "device available", not part of it.
	if got, _ := deviceIDFirmware(append([]byte{0x20, 0x01, 0x83, 0x07}, mandatory[4:]...)); got != "3.07" {
		t.Errorf("major with update-in-progress bit = %q, want 3.07", got)
	}
	if _, err := deviceIDFirmware(mandatory[:10]); err == nil {
		t.Error("10 data bytes: no error")
	}
}
