package agent

import (
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// smbiosStrings is an SMBIOS string set: each string NUL-terminated, the
// set ending in one more NUL; no strings is a double NUL (DSP0134 §6.1.3).
func smbiosStrings(strs ...string) []byte {
	var b []byte
	for _, s := range strs {
		b = append(append(b, s...), 0)
	}
	if len(strs) == 0 {
		b = append(b, 0)
	}
	return append(b, 0)
}

// type4 builds an SMBIOS type 4 Processor Information structure (DSP0134
// §7.5) in the SMBIOS 3.0 layout (length 30h), then cuts its formatted area
// to length (1Ah: SMBIOS 2.0; 28h: 2.5, before Processor Family 2; 2Ah:
// 2.6) and appends its three strings.
func type4(ptype, family byte, family2 uint16, status byte, length int) []byte {
	b := make([]byte, 0x30)
	b[0x00] = 4                                     // Type
	binary.LittleEndian.PutUint16(b[0x02:], 0x004B) // Handle
	b[0x04] = 1                                     // Socket Designation: string 1
	b[0x05] = ptype                                 // Processor Type (03h Central Processor)
	b[0x06] = family                                // Processor Family
	b[0x07] = 2                                     // Processor Manufacturer: string 2
	// 08h-0Fh Processor ID (CPUID EAX=1 EAX, EDX on x86; MIDR on ARM): not read.
	b[0x10] = 3                                      // Processor Version: string 3
	b[0x11] = 0x80 | 12                              // Voltage: 1.2 V
	binary.LittleEndian.PutUint16(b[0x12:], 100)     // External Clock, MHz
	binary.LittleEndian.PutUint16(b[0x14:], 4000)    // Max Speed, MHz
	binary.LittleEndian.PutUint16(b[0x16:], 2000)    // Current Speed, MHz
	b[0x18] = status                                 // Status: bit 6 populated, bits 2:0 enabled
	b[0x19] = 0x01                                   // Processor Upgrade: Other
	binary.LittleEndian.PutUint16(b[0x1A:], 0xFFFF)  // L1 Cache Handle: none
	binary.LittleEndian.PutUint16(b[0x1C:], 0xFFFF)  // L2
	binary.LittleEndian.PutUint16(b[0x1E:], 0xFFFF)  // L3
	b[0x23], b[0x24], b[0x25] = 32, 32, 64           // Core Count, Core Enabled, Thread Count
	binary.LittleEndian.PutUint16(b[0x26:], 0x00FC)  // Processor Characteristics: 64-bit capable, multi-core, ...
	binary.LittleEndian.PutUint16(b[0x28:], family2) // Processor Family 2
	binary.LittleEndian.PutUint16(b[0x2A:], 32)      // Core Count 2
	binary.LittleEndian.PutUint16(b[0x2C:], 32)      // Core Enabled 2
	binary.LittleEndian.PutUint16(b[0x2E:], 64)      // Thread Count 2
	b = b[:length]
	b[0x01] = byte(length) // Length of the formatted area
	return append(b, smbiosStrings("CPU0", "Vendor", "Model")...)
}

// type44 builds an SMBIOS type 44 Processor Additional Information
// structure (DSP0134 §7.45): header, Referenced Handle of the type 4 it
// adds to, then the Processor-Specific Block: Block Length (the length of
// the processor-specific data), Processor Type (Processor Architecture
// Types, §7.45.1) and the data (its per-architecture layout, e.g. RISC-V's
// §7.45.2, is not read). No strings.
func type44(archType byte, data []byte) []byte {
	b := []byte{44, byte(0x08 + len(data)), 0x50, 0x00, 0x4B, 0x00, byte(len(data)), archType}
	b = append(b, data...)
	return append(b, smbiosStrings()...)
}

const (
	populated = 0x41 // Status: CPU Socket Populated, CPU Enabled
	central   = 0x03 // Processor Type: Central Processor
)

func TestParseSMBIOSArch(t *testing.T) {
	// A RISC-V block carries 110 bytes of data (revision, hart ID, ISA
	// and extension bits...); only its size matters here.
	rv64Data := make([]byte, 0x6E)
	truncated44 := type44(0x05, nil)[:7] // cut before the Processor Type
	claimsMore := type4(central, 0xB3, 0, populated, 0x30)
	claimsMore[0x01] = 0xFF // Length beyond the bytes there
	cases := []struct {
		name    string
		raw     []byte
		want    string
		wantErr error
	}{
		// Type 44 (SMBIOS 3.3+): the architecture is stated outright.
		{"44 IA32", type44(0x01, nil), "386", nil},
		{"44 x64", type44(0x02, nil), "amd64", nil},
		{"44 IA64", type44(0x03, nil), "", nil},
		{"44 ARM32", type44(0x04, nil), "arm", nil},
		{"44 ARM64", type44(0x05, nil), "arm64", nil},
		{"44 RV32", type44(0x06, nil), "", nil},
		{"44 RV64 with its data block", type44(0x07, rv64Data), "riscv64", nil},
		{"44 RV128", type44(0x08, nil), "", nil},
		{"44 LoongArch32", type44(0x09, nil), "", nil},
		{"44 LoongArch64", type44(0x0A, nil), "loong64", nil},
		{"44 reserved 00h", type44(0x00, nil), "", nil},
		{"44 reserved 0Bh", type44(0x0B, nil), "", nil},
		{"44 cut before Processor Type", truncated44, "", ErrDMITruncated},
		{"44 length 07h, no Processor Type", []byte{44, 0x07, 0x50, 0x00, 0x4B, 0x00, 0x00, 0x00, 0x00}, "", ErrDMITruncated},

		// Type 4: Processor Family, FEh meaning Processor Family 2.
		{"4 Intel Xeon (B3h)", type4(central, 0xB3, 0xB3, populated, 0x30), "amd64", nil},
		{"4 Intel Core i7 (C6h)", type4(central, 0xC6, 0xC6, populated, 0x30), "amd64", nil},
		{"4 Intel Core i9 (CFh)", type4(central, 0xCF, 0xCF, populated, 0x30), "amd64", nil},
		{"4 Quad-Core Xeon 5400 (A9h)", type4(central, 0xA9, 0, populated, 0x28), "amd64", nil},
		{"4 Multi-Core Xeon 3400 (E0h)", type4(central, 0xE0, 0, populated, 0x28), "amd64", nil},
		{"4 AMD Zen, EPYC (6Bh)", type4(central, 0x6B, 0x6B, populated, 0x30), "amd64", nil},
		{"4 AMD Opteron (84h), SMBIOS 2.0 length", type4(central, 0x84, 0, populated, 0x1A), "amd64", nil},
		{"4 ARMv7 via Family 2 (100h)", type4(central, 0xFE, 0x100, populated, 0x30), "arm", nil},
		{"4 ARMv8 via Family 2 (101h)", type4(central, 0xFE, 0x101, populated, 0x30), "arm64", nil},
		{"4 ARMv9 via Family 2 (102h)", type4(central, 0xFE, 0x102, populated, 0x2A), "arm64", nil},
		{"4 RISC-V RV64 via Family 2 (201h)", type4(central, 0xFE, 0x201, populated, 0x30), "riscv64", nil},
		{"4 RISC-V RV32 via Family 2 (200h)", type4(central, 0xFE, 0x200, populated, 0x30), "", nil},
		{"4 Family 2 announced, SMBIOS 2.5 length", type4(central, 0xFE, 0x101, populated, 0x28), "", nil},
		{"4 Family 2 reserved FFFFh", type4(central, 0xFE, 0xFFFF, populated, 0x30), "", nil},
		{"4 Other (01h, QEMU's default)", type4(central, 0x01, 0x01, populated, 0x30), "", nil},
		{"4 Unknown (02h)", type4(central, 0x02, 0x02, populated, 0x30), "", nil},
		{"4 Pentium 4 (B2h): 32- and 64-bit parts", type4(central, 0xB2, 0, populated, 0x28), "", nil},
		{"4 Intel Core Duo (28h): 32-bit only Yonah", type4(central, 0x28, 0, populated, 0x28), "", nil},
		{"4 AMD Opteron A-Series (69h) is ARM", type4(central, 0x69, 0, populated, 0x28), "", nil},
		{"4 unpopulated socket", type4(central, 0xB3, 0xB3, 0x00, 0x30), "", nil},
		{"4 math processor", type4(0x04, 0xB3, 0xB3, populated, 0x30), "", nil},
		{"4 shorter than SMBIOS 2.0", type4(central, 0xB3, 0, populated, 0x19), "", ErrDMITruncated},
		{"4 length beyond the data", claimsMore, "", ErrDMITruncated},

		// Neither type.
		{"17 memory device", append([]byte{17, 0x28}, make([]byte, 0x26)...), "", ErrDMINotProcessor},
		{"header cut", []byte{4, 0x30, 0x4B}, "", ErrDMITruncated},
		{"empty", nil, "", ErrDMITruncated},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := ParseSMBIOSArch(c.raw)
			if got != c.want || !errors.Is(err, c.wantErr) || (c.wantErr == nil) != (err == nil) {
				t.Errorf("ParseSMBIOSArch(% x) = %q, %v; want %q, %v", c.raw, got, err, c.want, c.wantErr)
			}
		})
	}
}

// TestReadSMBIOSArch: the reader prefers any type 44 entry that names an
// arch over type 4, takes the first entry that names one in instance order
// (4-2 before 4-10), skips malformed entries and empty sockets, and gives
// "" without SMBIOS entries.
func TestReadSMBIOSArch(t *testing.T) {
	type entries map[string][]byte // "T-N" → raw
	xeon := type4(central, 0xB3, 0xB3, populated, 0x30)
	armv8 := type4(central, 0xFE, 0x101, populated, 0x30)
	empty := type4(central, 0x02, 0x02, 0x00, 0x30)
	cases := []struct {
		name string
		ents entries
		want string
	}{
		{"no entries", nil, ""},
		{"type 44 over type 4", entries{"4-0": xeon, "44-0": type44(0x08, nil), "44-1": type44(0x05, nil)}, "arm64"},
		{"type 44 naming nothing: type 4", entries{"44-0": type44(0x03, nil), "4-0": armv8}, "arm64"},
		{"malformed type 44 skipped", entries{"44-0": type44(0x02, nil)[:6], "4-0": armv8}, "arm64"},
		{"empty socket skipped", entries{"4-0": empty, "4-1": xeon}, "amd64"},
		{"instance order, not string order", entries{"4-10": armv8, "4-2": xeon}, "amd64"},
		{"only unnamed families", entries{"4-0": type4(central, 0x01, 0x01, populated, 0x30)}, ""},
		{"memory devices only", entries{"17-0": append([]byte{17, 0x28}, make([]byte, 0x26)...)}, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			root := t.TempDir()
			for name, raw := range c.ents {
				dir := filepath.Join(root, "sys/firmware/dmi/entries", name)
				if err := os.MkdirAll(dir, 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(dir, "raw"), raw, 0o444); err != nil {
					t.Fatal(err)
				}
			}
			if got := readSMBIOSArch(root); got != c.want {
				t.Errorf("readSMBIOSArch(%v) = %q, want %q", c.name, got, c.want)
			}
		})
	}
}

// FuzzParseSMBIOSArch: any bytes give either an error and no arch, or no
// error and "" or one of the six GOARCH names the schema admits.
func FuzzParseSMBIOSArch(f *testing.F) {
	f.Add(type44(0x05, nil))
	f.Add(type44(0x07, make([]byte, 0x6E)))
	f.Add(type4(central, 0xFE, 0x101, populated, 0x30))
	f.Add(type4(central, 0xB3, 0, populated, 0x1A))
	f.Add([]byte{44, 0x08})
	f.Fuzz(func(t *testing.T, raw []byte) {
		if len(raw) > 4096 {
			return
		}
		a, err := ParseSMBIOSArch(raw)
		if err != nil && a != "" {
			t.Errorf("ParseSMBIOSArch = %q with error %v", a, err)
		}
		switch a {
		case "", "386", "amd64", "arm", "arm64", "riscv64", "loong64":
		default:
			t.Errorf("ParseSMBIOSArch = %q, not a name the report schema admits", a)
		}
	})
}
