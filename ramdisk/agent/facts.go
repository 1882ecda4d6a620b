package agent

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"

	v1 "github.com/machina-metal/machina/api/v1"
)

// ErrNoCPUInfo is returned by CollectFacts when /proc/cpuinfo is missing or
// lists no processor: every Linux system has one, so the root is wrong.
var ErrNoCPUInfo = errors.New("no processors in /proc/cpuinfo")

// CollectFacts reads the hardware facts of the machine whose /proc and /sys
// are mounted under root ("/" on the target, a recorded tree in tests).
// Missing optional sources (DMI, NICs, disks) give empty fields, not errors;
// only an unreadable /proc/cpuinfo or /proc/meminfo fails.
func CollectFacts(root string) (v1.Facts, error) {
	var f v1.Facts
	var err error
	if f.CPU, err = readCPU(root); err != nil {
		return f, fmt.Errorf("collect facts: %w", err)
	}
	if f.Memory, err = readMemory(root); err != nil {
		return f, fmt.Errorf("collect facts: %w", err)
	}
	if f.Disks, err = readDisks(root); err != nil {
		return f, fmt.Errorf("collect facts: %w", err)
	}
	if f.NICs, err = readNICs(root); err != nil {
		return f, fmt.Errorf("collect facts: %w", err)
	}
	f.DMI = readDMI(root)
	f.GPUs = readGPUs(root)
	return f, nil
}

// goArch maps a kernel machine name (uname -m, /proc/sys/kernel/arch) to
// its GOARCH name; "" means the agent's own build (it runs on the target).
func goArch(machine string) string {
	switch machine {
	case "":
		return runtime.GOARCH
	case "x86_64":
		return "amd64"
	case "aarch64", "arm64":
		return "arm64"
	case "i386", "i686":
		return "386"
	case "ppc64le":
		return "ppc64le"
	case "s390x":
		return "s390x"
	case "riscv64":
		return "riscv64"
	}
	return machine
}

// pciVendors names the GPU vendors by PCI vendor id (PCI-SIG registry).
var pciVendors = map[string]string{"0x10de": "nvidia", "0x1002": "amd", "0x8086": "intel"}

// bmcVGA are the vendor ids of the VGA controllers BMCs put on the host's
// PCI bus for their remote console (ASPEED AST2x00 1a03h on most servers,
// Matrox G200 102bh on Dell and HPE): a display controller, not a GPU.
var bmcVGA = map[string]bool{"0x1a03": true, "0x102b": true}

// readGPUs lists the PCI display controllers (class 03xxxxh) under
// sys/bus/pci/devices, in address order, leaving out BMC VGA devices.
func readGPUs(root string) []v1.GPU {
	dir := filepath.Join(root, "sys/bus/pci/devices")
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var out []v1.GPU
	for _, e := range ents {
		p := filepath.Join(dir, e.Name())
		class := strings.ToLower(readTrim(filepath.Join(p, "class")))
		if !strings.HasPrefix(class, "0x03") {
			continue
		}
		vid := strings.ToLower(readTrim(filepath.Join(p, "vendor")))
		if bmcVGA[vid] {
			continue
		}
		g := v1.GPU{PCIAddress: e.Name(), VendorID: vid, DeviceID: strings.ToLower(readTrim(filepath.Join(p, "device"))), Vendor: pciVendors[vid]}
		if g.Vendor == "" {
			g.Vendor = vid
		}
		out = append(out, g)
	}
	return out
}

// readTrim returns the trimmed content of a sysfs attribute, "" if absent.
func readTrim(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

func readInt(path string) (int64, bool) {
	s := readTrim(path)
	if s == "" {
		return 0, false
	}
	n, err := strconv.ParseInt(s, 10, 64)
	return n, err == nil
}

func readCPU(root string) (v1.CPU, error) {
	var c v1.CPU
	b, err := os.ReadFile(filepath.Join(root, "proc/cpuinfo"))
	if err != nil {
		return c, fmt.Errorf("read cpuinfo: %w", err)
	}
	type coreKey struct{ pkg, core string }
	packages := map[string]bool{}
	cores := map[coreKey]bool{}
	var pkg, core string
	flush := func() {
		if pkg == "" {
			pkg = "0"
		}
		packages[pkg] = true
		if core != "" {
			cores[coreKey{pkg, core}] = true
		}
		pkg, core = "", ""
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	inProc := false
	for sc.Scan() {
		line := sc.Text()
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			if strings.TrimSpace(line) == "" && inProc {
				flush()
				inProc = false
			}
			continue
		}
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		switch k {
		case "processor":
			if inProc {
				flush()
			}
			inProc = true
			c.Threads++
		case "model name":
			if c.Model == "" {
				c.Model = v
			}
		case "vendor_id":
			if c.Vendor == "" {
				c.Vendor = v
			}
		case "physical id":
			pkg = v
		case "core id":
			core = v
		case "flags":
			if c.Flags == nil {
				c.Flags = strings.Fields(v)
				sort.Strings(c.Flags)
			}
		}
	}
	if inProc {
		flush()
	}
	if c.Threads == 0 {
		return c, ErrNoCPUInfo
	}
	c.Sockets = len(packages)
	c.Cores = len(cores)
	if c.Cores == 0 { // no "core id" lines (some hypervisors): one core per thread
		c.Cores = c.Threads
	}
	cpuExtras(root, &c)
	return c, nil
}

// cpuExtras adds what cpuinfo's entries do not say directly: the
// virtualization extension (vmx, svm) from the flags, the architecture
// (proc/sys/kernel/arch), the architecture SMBIOS states (readSMBIOSArch)
// and the online CPUs (sys/devices/system/cpu/online).
func cpuExtras(root string, c *v1.CPU) {
	for _, fl := range c.Flags {
		if fl == "vmx" || fl == "svm" {
			c.Virtualization = fl
		}
	}
	if m := readTrim(filepath.Join(root, "proc/sys/kernel/arch")); m != "" || filepath.Clean(root) == "/" {
		c.Arch = goArch(m)
	}
	c.SMBIOSArch = readSMBIOSArch(root)
	if s := readTrim(filepath.Join(root, "sys/devices/system/cpu/online")); s != "" {
		if n, err := countCPUList(s); err == nil {
			c.Online = n
		}
	}
}

// countCPUList counts the CPUs in a kernel cpu list such as "0-3,8,10-11"
// (Documentation/admin-guide/cputopology.rst).
func countCPUList(s string) (int, error) {
	n := 0
	for _, part := range strings.Split(strings.TrimSpace(s), ",") {
		if part == "" {
			continue
		}
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil {
			return 0, fmt.Errorf("cpu list %q: %w", s, err)
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil {
				return 0, fmt.Errorf("cpu list %q: %w", s, err)
			}
		}
		if b < a || b-a > 1<<16 {
			return 0, fmt.Errorf("cpu list %q: bad range", s)
		}
		n += b - a + 1
	}
	return n, nil
}

func readMemory(root string) (v1.Memory, error) {
	var m v1.Memory
	b, err := os.ReadFile(filepath.Join(root, "proc/meminfo"))
	if err != nil {
		return m, fmt.Errorf("read meminfo: %w", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "MemTotal:"); ok {
			fs := strings.Fields(rest)
			if len(fs) >= 1 {
				kb, err := strconv.ParseInt(fs[0], 10, 64)
				if err != nil {
					return m, fmt.Errorf("parse MemTotal %q: %w", rest, err)
				}
				m.TotalBytes = kb * 1024
			}
		}
	}
	if m.TotalBytes == 0 {
		return m, errors.New("read meminfo: no MemTotal")
	}
	entries, _ := filepath.Glob(filepath.Join(root, "sys/firmware/dmi/entries/17-*/raw"))
	sort.Strings(entries)
	for _, e := range entries {
		raw, err := os.ReadFile(e)
		if err != nil {
			continue
		}
		d, ok, err := ParseDMIMemoryDevice(raw)
		if err != nil || !ok {
			continue
		}
		m.DIMMs = append(m.DIMMs, d)
	}
	return m, nil
}

// Errors from ParseDMIMemoryDevice (both) and ParseSMBIOSArch (ErrDMITruncated).
var (
	// ErrDMITruncated: the structure is shorter than its header claims.
	ErrDMITruncated = errors.New("dmi: truncated structure")
	// ErrDMIType: the structure is not type 17.
	ErrDMIType = errors.New("dmi: not a memory device (type 17)")
)

// ParseDMIMemoryDevice decodes one SMBIOS type 17 (Memory Device) structure as
// exported in /sys/firmware/dmi/entries/17-N/raw (SMBIOS 3.x §7.18: formatted
// area of header length, then NUL-terminated strings ending in a double NUL).
// ok is false for an empty slot (size 0) or unknown size (0xFFFF).
func ParseDMIMemoryDevice(raw []byte) (d v1.DIMM, ok bool, err error) {
	if len(raw) < 4 {
		return d, false, ErrDMITruncated
	}
	if raw[0] != 17 {
		return d, false, ErrDMIType
	}
	ln := int(raw[1])
	if ln < 0x15 || ln > len(raw) {
		return d, false, ErrDMITruncated
	}
	var strs []string
	for rest := raw[ln:]; len(rest) > 0; {
		i := bytes.IndexByte(rest, 0)
		if i <= 0 {
			break
		}
		strs = append(strs, strings.TrimSpace(string(rest[:i])))
		rest = rest[i+1:]
	}
	str := func(off int) string {
		if off >= ln {
			return ""
		}
		idx := int(raw[off])
		if idx == 0 || idx > len(strs) {
			return ""
		}
		return strs[idx-1]
	}
	u16 := func(off int) int { return int(raw[off]) | int(raw[off+1])<<8 }
	size := u16(0x0C)
	switch {
	case size == 0 || size == 0xFFFF:
		return d, false, nil
	case size == 0x7FFF && ln < 0x20:
		return d, false, nil // extended size announced but the structure lacks it
	case size == 0x7FFF:
		ext := int64(raw[0x1C]) | int64(raw[0x1D])<<8 | int64(raw[0x1E])<<16 | int64(raw[0x1F]&0x7F)<<24
		d.SizeBytes = ext << 20
	case size&0x8000 != 0:
		d.SizeBytes = int64(size&0x7FFF) << 10
	default:
		d.SizeBytes = int64(size) << 20
	}
	if d.SizeBytes <= 0 {
		return d, false, nil
	}
	d.Locator = str(0x10)
	d.Type = dmiMemoryType(raw[0x12])
	if ln >= 0x17 {
		d.SpeedMTs = u16(0x15)
	}
	if ln >= 0x1B {
		d.Manufacturer = str(0x17)
		d.Serial = str(0x18)
		d.PartNumber = str(0x1A)
	}
	return d, true, nil
}

// dmiMemoryType maps the SMBIOS Memory Device Type byte (table 76) to a name.
func dmiMemoryType(b byte) string {
	switch b {
	case 0x12:
		return "DDR"
	case 0x13:
		return "DDR2"
	case 0x18:
		return "DDR3"
	case 0x1A:
		return "DDR4"
	case 0x1B:
		return "LPDDR"
	case 0x1D:
		return "LPDDR3"
	case 0x1E:
		return "LPDDR4"
	case 0x22:
		return "DDR5"
	case 0x23:
		return "LPDDR5"
	case 0x07:
		return "RAM"
	case 0x0F:
		return "SDRAM"
	}
	return ""
}

func readDMI(root string) v1.DMI {
	d := filepath.Join(root, "sys/class/dmi/id")
	r := func(n string) string { return cleanDMI(readTrim(filepath.Join(d, n))) }
	return v1.DMI{
		SystemVendor:  r("sys_vendor"),
		SystemProduct: r("product_name"),
		SystemSerial:  r("product_serial"),
		SystemUUID:    strings.ToLower(r("product_uuid")),
		BoardVendor:   r("board_vendor"),
		BoardProduct:  r("board_name"),
		BoardSerial:   r("board_serial"),
		BIOSVendor:    r("bios_vendor"),
		BIOSVersion:   r("bios_version"),
		BIOSDate:      r("bios_date"),
	}
}

// cleanDMI drops the placeholder strings firmware fills unset fields with.
func cleanDMI(s string) string {
	switch strings.ToLower(s) {
	case "", "to be filled by o.e.m.", "default string", "not specified", "none", "0123456789":
		return ""
	}
	return s
}

// skipDiskPrefixes are block devices that are never disks of the machine.
var skipDiskPrefixes = []string{"loop", "ram", "zram", "dm-", "md", "sr", "fd", "nbd"}

var pciAddr = regexp.MustCompile(`^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$`)
var hctl = regexp.MustCompile(`^[0-9]+:[0-9]+:[0-9]+:[0-9]+$`)

// virtualMediaMarkers are lower-case vendor/model substrings of BMC virtual
// media and similar emulated installer devices (iDRAC "Virtual CD"/"Virtual
// Floppy", iLO "Virtual DVD-ROM", Supermicro "Virtual HDisk", Lenovo XCC
// "SDCard/Virtual_Media", Cisco "vKVM").
var virtualMediaMarkers = []string{"virtual", "vkvm", "idrac", "ilo", "v-media", "vmedia"}

func readDisks(root string) ([]v1.Disk, error) {
	base := filepath.Join(root, "sys/block")
	ents, err := os.ReadDir(base)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read sys/block: %w", err)
	}
	var disks []v1.Disk
next:
	for _, e := range ents {
		name := e.Name()
		for _, p := range skipDiskPrefixes {
			if strings.HasPrefix(name, p) {
				continue next
			}
		}
		dir := filepath.Join(base, name)
		sectors, ok := readInt(filepath.Join(dir, "size"))
		if !ok || sectors == 0 {
			continue
		}
		d := v1.Disk{Name: name, SizeBytes: sectors * 512}
		d.Rotational = readTrim(filepath.Join(dir, "queue/rotational")) == "1"
		d.ReadOnly = readTrim(filepath.Join(dir, "ro")) == "1"
		d.Removable = readTrim(filepath.Join(dir, "removable")) == "1"
		dev := filepath.Join(dir, "device")
		vendor := readTrim(filepath.Join(dev, "vendor"))
		d.Model = strings.TrimSpace(readTrim(filepath.Join(dev, "model")))
		d.Serial = firstNonEmpty(readTrim(filepath.Join(dev, "serial")), readTrim(filepath.Join(dir, "serial")), vpdSerial(filepath.Join(dev, "vpd_pg80")))
		d.WWN = firstNonEmpty(readTrim(filepath.Join(dir, "wwid")), readTrim(filepath.Join(dev, "wwid")), readTrim(filepath.Join(dev, "wwn")))
		d.WWN = strings.TrimSpace(strings.Join(strings.Fields(d.WWN), " "))
		real, err := filepath.EvalSymlinks(dir)
		if err == nil {
			d.ByPath, d.Transport = pathID(root, real, name)
		}
		if strings.HasPrefix(name, "vd") {
			d.Transport = "virtio"
		}
		id := strings.ToLower(vendor + " " + d.Model)
		for _, m := range virtualMediaMarkers {
			if strings.Contains(id, m) {
				d.Virtual = true
			}
		}
		disks = append(disks, d)
	}
	sort.Slice(disks, func(i, j int) bool { return disks[i].Name < disks[j].Name })
	return disks, nil
}

// vpdSerial extracts the unit serial number from SCSI VPD page 0x80
// (SPC-4 §7.8.19: 4-byte header, byte 3 = length, then ASCII).
func vpdSerial(path string) string {
	b, err := os.ReadFile(path)
	if err != nil || len(b) < 4 || b[1] != 0x80 {
		return ""
	}
	n := int(b[3])
	if 4+n > len(b) {
		n = len(b) - 4
	}
	return strings.TrimSpace(string(b[4 : 4+n]))
}

func firstNonEmpty(s ...string) string {
	for _, v := range s {
		if v != "" {
			return v
		}
	}
	return ""
}

// pathID derives the /dev/disk/by-path name and the transport of a block
// device from its resolved sysfs path, following systemd's path_id for the
// common cases: "pci-<addr>" for virtio-blk, "pci-<addr>-nvme-<nsid>",
// "pci-<addr>-ata-<port>", "pci-<addr>-usb-<port>-scsi-<hctl>" and
// "pci-<addr>-scsi-<hctl>" (SAS HBAs, RAID controllers, virtio-scsi).
func pathID(root, real, name string) (byPath, transport string) {
	rel := real
	if r, err := filepath.Rel(filepath.Join(root, "sys/devices"), real); err == nil && !strings.HasPrefix(r, "..") {
		rel = r
	}
	comps := strings.Split(filepath.ToSlash(rel), "/")
	var pci, ata, usb, scsi string
	nvme := false
	for _, c := range comps {
		switch {
		case pciAddr.MatchString(c):
			pci = c
			ata, usb, scsi = "", "", ""
		case strings.HasPrefix(c, "ata") && isDigits(c[3:]):
			ata = c[3:]
		case strings.HasPrefix(c, "usb") && isDigits(c[3:]):
			usb = "x"
		case usb != "" && strings.Contains(c, ":") && strings.Contains(c, "-") && !hctl.MatchString(c):
			// USB interface "1-1:1.0": path_id prints "usb-0:1:1.0".
			if _, after, ok := strings.Cut(c, "-"); ok {
				usb = "0:" + after
			}
		case hctl.MatchString(c):
			scsi = c
		case c == "nvme":
			nvme = true
		}
	}
	if pci == "" {
		return "", ""
	}
	p := "pci-" + pci
	switch {
	case nvme:
		ns := name[strings.LastIndex(name, "n")+1:]
		return p + "-nvme-" + ns, "nvme"
	case ata != "":
		return p + "-ata-" + ata, "sata"
	case usb != "" && scsi != "":
		return p + "-usb-" + usb + "-scsi-" + zeroHost(scsi), "usb"
	case scsi != "":
		return p + "-scsi-" + zeroHost(scsi), "scsi"
	}
	return p, ""
}

// zeroHost replaces the SCSI host number (which depends on probe order) by 0,
// as path_id does for the host of a single-host adapter.
func zeroHost(h string) string {
	_, rest, _ := strings.Cut(h, ":")
	return "0:" + rest
}

func isDigits(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if r < '0' || r > '9' {
			return false
		}
	}
	return true
}

// pciBDF is a PCI function's sysfs name: domain:bus:device.function.
var pciBDF = regexp.MustCompile(`^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$`)

// pciAddress returns the PCI function nearest the device in a
// /sys/class/net/<if>/device link target: the link itself for a PCI NIC
// (../../../0000:3b:00.0), its parent for a virtio NIC
// (.../0000:00:03.0/virtio0); "" when no path element is one.
func pciAddress(link string) string {
	parts := strings.Split(filepath.ToSlash(link), "/")
	for i := len(parts) - 1; i >= 0; i-- {
		if pciBDF.MatchString(parts[i]) {
			return parts[i]
		}
	}
	return ""
}

func readNICs(root string) ([]v1.NIC, error) {
	base := filepath.Join(root, "sys/class/net")
	ents, err := os.ReadDir(base)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read sys/class/net: %w", err)
	}
	var nics []v1.NIC
	for _, e := range ents {
		dir := filepath.Join(base, e.Name())
		if _, err := os.Stat(filepath.Join(dir, "device")); err != nil {
			continue // lo, bridges, veth, tunnels: no backing device
		}
		n := v1.NIC{Name: e.Name(), MAC: strings.ToLower(readTrim(filepath.Join(dir, "address")))}
		if drv, err := os.Readlink(filepath.Join(dir, "device/driver")); err == nil {
			n.Driver = filepath.Base(drv)
		}
		if dev, err := os.Readlink(filepath.Join(dir, "device")); err == nil {
			n.PCIAddress = pciAddress(dev)
		}
		n.Link = readTrim(filepath.Join(dir, "operstate")) == "up" || readTrim(filepath.Join(dir, "carrier")) == "1"
		if sp, ok := readInt(filepath.Join(dir, "speed")); ok && sp > 0 && n.Link {
			n.SpeedMbps = int(sp)
		}
		nics = append(nics, n)
	}
	sort.Slice(nics, func(i, j int) bool { return nics[i].Name < nics[j].Name })
	return nics, nil
}
