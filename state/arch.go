package state

// arch64Of maps a 32-bit GOARCH to the 64-bit architecture whose processors
// also boot its kernels: an i386 kernel on an x86-64 processor, an AArch32
// ("arm") kernel on an ARMv8 or ARMv9 processor that implements AArch32.
var arch64Of = map[string]string{"386": "amd64", "arm": "arm64"}

// MachineArch returns the architecture (a GOARCH name) images must be built
// for: SMBIOSArch when the kernel's Arch is the 32-bit member of
// SMBIOSArch's family ("386" under "amd64", "arm" under "arm64": the
// processor is the 64-bit one, only the commissioning kernel is 32-bit),
// SMBIOSArch when Arch is unknown, else Arch (also when the two conflict:
// [Hardware.ArchConflict] then holds and the plan refuses to allocate or
// deploy). "" for a nil Hardware or when neither is known. It does not
// allocate.
func (h *Hardware) MachineArch() string {
	switch {
	case h == nil:
		return ""
	case h.Arch == "":
		return h.SMBIOSArch
	case h.SMBIOSArch != "" && arch64Of[h.Arch] == h.SMBIOSArch:
		return h.SMBIOSArch
	}
	return h.Arch
}

// ArchConflict reports whether the kernel's Arch and the firmware's
// SMBIOSArch are both known and name different machines: they differ and
// Arch is not the 32-bit member of SMBIOSArch's family ("arm64" against
// "amd64", or "amd64" against "386": a 64-bit kernel cannot run on a
// 32-bit processor). One of the two is wrong and only a human can tell
// which. False for a nil Hardware. It does not allocate.
func (h *Hardware) ArchConflict() bool {
	if h == nil || h.Arch == "" || h.SMBIOSArch == "" || h.Arch == h.SMBIOSArch {
		return false
	}
	return arch64Of[h.Arch] != h.SMBIOSArch
}
