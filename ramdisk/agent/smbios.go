package agent

import (
	"errors"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// ErrDMINotProcessor is returned by ParseSMBIOSArch for a structure that is
// neither type 4 (Processor Information) nor type 44 (Processor Additional
// Information).
var ErrDMINotProcessor = errors.New("dmi: not processor information (type 4 or 44)")

// SMBIOS structure types read for the architecture (DSP0134 3.3+ §7.5, §7.45).
const (
	smbiosProcessorInfo       = 4
	smbiosProcessorAdditional = 44
)

// ParseSMBIOSArch returns the architecture, as a GOARCH name ("386",
// "amd64", "arm", "arm64", "riscv64", "loong64"), that one SMBIOS
// structure states, as exported in /sys/firmware/dmi/entries/T-N/raw
// (formatted area of header length, then the string set). Two structures
// say it (DMTF DSP0134 3.3 and later):
//
//   - Type 44, Processor Additional Information (§7.45): a 4-byte header,
//     the Referenced Handle (04h, WORD), then the Processor-Specific Block
//     (06h): Block Length (BYTE) and Processor Type (07h, BYTE), whose
//     values are the Processor Architecture Types (§7.45.1): 01h IA32
//     (386), 02h x64 (amd64), 04h ARM32 (arm), 05h ARM64 (arm64), 07h
//     RV64 (riscv64), 0Ah LoongArch64 (loong64). 03h IA64, 06h RV32, 08h
//     RV128 and 09h LoongArch32 have no GOARCH and give "".
//   - Type 4, Processor Information (§7.5): Processor Type (05h) must be
//     03h Central Processor and the Status byte (18h) must have bit 6 (CPU
//     Socket Populated) set; the Processor Family (06h, BYTE, §7.5.2), or
//     when it is FEh the Processor Family 2 (28h, WORD, SMBIOS 2.6+), is
//     mapped only where the family names one architecture (see smbiosFamilyArch).
//
// It returns "" and nil for a structure that names no architecture
// (unpopulated socket, other processor type, unknown family, Family 2
// announced but the structure too short for it); ErrDMITruncated when raw
// is shorter than the header or the length it claims, or shorter than the
// fields its type requires (type 4: 1Ah bytes, SMBIOS 2.0; type 44: 08h);
// ErrDMINotProcessor for any other type.
func ParseSMBIOSArch(raw []byte) (string, error) {
	if len(raw) < 4 {
		return "", ErrDMITruncated
	}
	ln := int(raw[1])
	if ln > len(raw) {
		return "", ErrDMITruncated
	}
	switch raw[0] {
	case smbiosProcessorAdditional:
		// Only the block's Processor Type is read, so the structure must
		// reach it; the processor-specific data after it (Block Length
		// bytes) is not needed and not checked.
		if ln < 0x08 {
			return "", ErrDMITruncated
		}
		return smbiosArchType(raw[7]), nil
	case smbiosProcessorInfo:
		if ln < 0x1A {
			return "", ErrDMITruncated
		}
		if raw[0x05] != 0x03 || raw[0x18]&0x40 == 0 {
			return "", nil // not a central processor, or an empty socket
		}
		family := int(raw[0x06])
		if family == 0xFE {
			if ln < 0x2A {
				return "", nil // Family 2 announced, structure predates it
			}
			family = int(raw[0x28]) | int(raw[0x29])<<8
		}
		return smbiosFamilyArch(family), nil
	}
	return "", ErrDMINotProcessor
}

// smbiosArchType maps a type 44 Processor Architecture Type (DSP0134
// §7.45.1) to its GOARCH name, "" for the types Go has no port for and for
// reserved values.
func smbiosArchType(b byte) string {
	switch b {
	case 0x01:
		return "386" // IA32 (x86)
	case 0x02:
		return "amd64" // x64 (x86-64, Intel 64, AMD64, EM64T)
	case 0x04:
		return "arm" // 32-bit ARM (AArch32)
	case 0x05:
		return "arm64" // 64-bit ARM (AArch64)
	case 0x07:
		return "riscv64" // 64-bit RISC-V (RV64)
	case 0x0A:
		return "loong64" // 64-bit LoongArch (LoongArch64)
	}
	return "" // 03h IA64, 06h RV32, 08h RV128, 09h LoongArch32, reserved
}

// smbiosFamilyArch maps a type 4 Processor Family (DSP0134 §7.5.2,
// Processor Family and Processor Family 2) to a GOARCH name where every
// processor of the family is of that architecture, else "". Families that
// mix 32-bit-only and 64-bit parts are left out: Intel Core Solo/Duo
// (Yonah), Atom, Pentium 4, Celeron, Xeon LV/ULV (Sossaman), AMD Sempron,
// Athlon. The one exception is 0xB3 "Intel Xeon": it also covers the
// NetBurst Xeons of 2001-2004 that lacked Intel 64, but every current Intel
// server processor reports it, and the SMBIOS arch only decides over the
// kernel's for a 32-bit kernel (docs/arm64.md), which Machina's ramdisk is not.
func smbiosFamilyArch(f int) string {
	switch {
	case f == 0x6B: // AMD Zen Processor Family (Ryzen, EPYC)
		return "amd64"
	case f == 0x83, f == 0x84, f == 0x87, f == 0x88, f == 0x8A, f == 0x8B:
		// AMD Athlon 64, Opteron, Dual-Core Opteron, Athlon 64 X2,
		// Quad-Core Opteron, Third-Generation Opteron
		return "amd64"
	case f >= 0xA1 && f <= 0xA5, f >= 0xA8 && f <= 0xAF:
		// Quad-/Dual-/Multi-Core Xeon 3200, 3000, 5300, 5100, 5000 and
		// 7100, 5400, Xeon, 5200, 7200, 7300, 7400 series
		return "amd64"
	case f == 0xB3: // Intel Xeon (see the doc comment)
		return "amd64"
	case f >= 0xBF && f <= 0xC6:
		// Intel Core 2 Duo, Solo, Extreme, Quad, Extreme mobile, Duo
		// mobile, Solo mobile; Intel Core i7
		return "amd64"
	case f == 0xCD, f == 0xCE, f == 0xCF: // Intel Core i5, i3, i9
		return "amd64"
	case f >= 0xD6 && f <= 0xD8, f == 0xDA, f == 0xDB, f >= 0xDD && f <= 0xE0:
		// Multi-Core Xeon; Dual-/Quad-Core Xeon 3xxx, 5xxx, 7xxx;
		// Multi-Core Xeon 7xxx, 3400 series
		return "amd64"
	case f == 0x100: // ARMv7 (32-bit only)
		return "arm"
	case f == 0x101, f == 0x102: // ARMv8, ARMv9
		return "arm64"
	case f == 0x201: // RISC-V RV64
		return "riscv64"
	}
	return "" // 0x200 RV32 and 0x202 RV128 have no GOARCH
}

// readSMBIOSArch returns the architecture SMBIOS states under root: the
// first type 44 entry (sys/firmware/dmi/entries/44-N/raw, by N) that names
// one, else the first type 4 entry that does, else "". Unreadable or
// malformed entries are skipped, as for the memory devices.
func readSMBIOSArch(root string) string {
	for _, typ := range []string{"44", "4"} {
		for _, e := range dmiEntries(root, typ) {
			raw, err := os.ReadFile(e)
			if err != nil {
				continue
			}
			if a, err := ParseSMBIOSArch(raw); err == nil && a != "" {
				return a
			}
		}
	}
	return ""
}

// dmiEntries lists the raw files of the SMBIOS entries of type typ under
// root's sys/firmware/dmi/entries, in instance order (4-2 before 4-10).
func dmiEntries(root, typ string) []string {
	entries, _ := filepath.Glob(filepath.Join(root, "sys/firmware/dmi/entries", typ+"-*", "raw"))
	inst := func(p string) int {
		_, n, _ := strings.Cut(filepath.Base(filepath.Dir(p)), "-")
		i, err := strconv.Atoi(n)
		if err != nil {
			return 1 << 30
		}
		return i
	}
	sort.SliceStable(entries, func(i, j int) bool { return inst(entries[i]) < inst(entries[j]) })
	return entries
}
