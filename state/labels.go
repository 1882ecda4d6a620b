package state

import (
	"regexp"
	"strconv"
	"strings"
)

// Derived label keys, the same as inventory.DerivedLabelKeys
// (state imports no inventory; a reconciler test checks they agree).
const (
	LabelCPUVendor     = "cpu.vendor"
	LabelCPUArch       = "cpu.arch"
	LabelMemoryGiB     = "memory.gib"
	LabelDiskNVMeCount = "disk.nvme.count"
	LabelNICSpeedMax   = "nic.speed.max"
	LabelGPUVendor     = "gpu.vendor"
)

var labelUnsafe = regexp.MustCompile(`[^A-Za-z0-9_.-]+`)

// Labels returns the labels derived from the commissioning report, for
// profile selectors (inventory.Selector):
//
//	cpu.vendor      intel (GenuineIntel), amd (AuthenticAMD), else vendor_id lower-cased
//	cpu.arch        the GOARCH name the agent reported (amd64, arm64)
//	memory.gib      installed memory in GiB: the DIMM total, else MemTotal rounded to the nearest GiB
//	disk.nvme.count disks on the NVMe transport, "0" when none
//	nic.speed.max   the fastest NIC's link speed in Mbps, "0" when unknown
//	gpu.vendor      the first GPU's vendor (nvidia, amd, intel); absent without a GPU
//
// A key whose fact the report lacks (older agents: cpu.vendor, cpu.arch)
// is absent. A nil Hardware (never commissioned) has no labels (nil).
func (h *Hardware) Labels() map[string]string {
	if h == nil {
		return nil
	}
	out := map[string]string{}
	switch v := h.CPUVendor; v {
	case "":
	case "GenuineIntel":
		out[LabelCPUVendor] = "intel"
	case "AuthenticAMD":
		out[LabelCPUVendor] = "amd"
	default:
		out[LabelCPUVendor] = labelValue(v)
	}
	if h.Arch != "" {
		out[LabelCPUArch] = labelValue(h.Arch)
	}
	mem := h.InstalledMemoryBytes
	if mem <= 0 {
		mem = h.MemoryBytes + 1<<29 // nearest GiB
	}
	out[LabelMemoryGiB] = strconv.FormatInt(mem>>30, 10)
	nvme, speed := 0, 0
	for _, d := range h.Disks {
		if d.Transport == "nvme" || (d.Transport == "" && strings.HasPrefix(d.Name, "nvme")) {
			nvme++
		}
	}
	for _, n := range h.NICs {
		speed = max(speed, n.SpeedMbps)
	}
	out[LabelDiskNVMeCount] = strconv.Itoa(nvme)
	out[LabelNICSpeedMax] = strconv.Itoa(speed)
	if len(h.GPUs) > 0 && h.GPUs[0].Vendor != "" {
		out[LabelGPUVendor] = labelValue(h.GPUs[0].Vendor)
	}
	return out
}

// labelValue makes s a valid label value: lower case, runs of other
// characters than letters, digits, '-', '_' and '.' as one '-', trimmed
// to 63 characters and to a letter or digit at both ends.
func labelValue(s string) string {
	s = labelUnsafe.ReplaceAllString(strings.ToLower(s), "-")
	if len(s) > 63 {
		s = s[:63]
	}
	return strings.Trim(s, "-_.")
}
