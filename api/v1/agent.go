// Package v1 holds the JSON wire types of Machina's HTTP API and a small
// net/http client for them. It is shared by the controller (`api`), the
// ramdisk agent (`ramdisk/agent`, `cmd/machina-agent`), the node agent and
// machinactl, so it imports nothing but the standard library.
//
// This file holds the machine-facing endpoints the ramdisk agent uses:
//
//	POST PathAgentReport   commissioning report (facts + test results)
//	GET  PathAgentPlan     deploy plan (image URL, checksum, disk rule, seed)
//	GET  Plan.ImageURL     the raw image (Range-capable)
//	POST PathAgentProgress a long deploy step's progress (every Plan.ProgressEvery)
//	POST PathAgentDone     deploy outcome
//	GET  PathAgentPayload  bytes for the network throughput test
//
// Every request carries a token in "Authorization: Bearer <token>". The
// controller hands the first token to the ramdisk on the kernel command line
// (machina.token=) and stores only its hash. In commissioning that token
// authorises PathAgentPayload (without being consumed) and is consumed by the
// single POST to PathAgentReport. In deploy it is consumed by the GET of
// PathAgentPlan, whose Plan carries a short-lived ImageToken (reusable for a
// second image pass, and for the progress reports) and a single-use
// DoneToken.
package v1

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"
)

// Machine-facing endpoint paths, relative to the controller base URL.
const (
	// PathAgentReport takes an AgentReport (POST, JSON) and answers ReportAck.
	PathAgentReport = "/v1/agent/report"
	// PathAgentPlan answers a Plan (GET).
	PathAgentPlan = "/v1/agent/plan"
	// PathAgentDone takes a DeployResult (POST, JSON) and answers 204.
	PathAgentDone = "/v1/agent/done"
	// PathAgentPayload answers N pseudo-random bytes (GET ?bytes=N, N at most
	// MaxPayloadBytes) for the commissioning network throughput test.
	PathAgentPayload = "/v1/agent/payload"
	// PathAgentWipe answers a WipePlan (GET) to the ramdisk booted in wipe
	// mode (machina.mode=wipe) for a released server.
	PathAgentWipe = "/v1/agent/wipe"
	// PathAgentWiped takes a WipeResult (POST, JSON) and answers 204.
	PathAgentWiped = "/v1/agent/wiped"
	// PathAgentProgress takes a Progress (POST, JSON) during a long step of
	// a deploy and answers 204, with the plan's ImageToken (not consumed);
	// a release wipe's StepErase reports carry WipePlan.ProgressToken.
	// The controller counts a report whose bytes advanced as hearing from
	// the machine; it never moves the lifecycle. A report sooner than the
	// controller's minimum interval is answered 429 and dropped.
	PathAgentProgress = "/v1/agent/progress"
)

// Limits the controller enforces on machine-facing requests; the agent stays
// below them.
const (
	// MaxReportBytes bounds an AgentReport body (1 MiB); larger bodies get 413.
	MaxReportBytes = 1 << 20
	// MaxDoneBytes bounds a DeployResult body (64 KiB).
	MaxDoneBytes = 64 << 10
	// MaxPayloadBytes bounds one payload response (64 MiB).
	MaxPayloadBytes = 64 << 20
	// MaxProgressBytes bounds a Progress body (1 KiB).
	MaxProgressBytes = 1 << 10
)

// Steps a Progress names: the long steps of an image deploy, in order.
const (
	// StepImageDownload is the image's download and hash (the one pass of
	// an image that fits in memory, the hash pass of a two-pass write).
	StepImageDownload = "image-download"
	// StepImageWrite is the write to the disk (the second pass of a
	// two-pass write, or the write from memory).
	StepImageWrite = "image-write"
	// StepImageReadBack is the read-back verification of the written range.
	StepImageReadBack = "image-read-back"
	// StepErase is a release wipe's erase of one disk (WipePlan.Erase other
	// than EraseMetadata), reported with the WipePlan's ProgressToken.
	StepErase = "erase"
)

// Progress is what the ramdisk posts to PathAgentProgress every
// Plan.ProgressEvery during a long step: how far the step is.
type Progress struct {
	// Step is StepImageDownload, StepImageWrite or StepImageReadBack.
	Step string `json:"step"`
	// BytesDone of BytesTotal bytes of the step are done (0 <= BytesDone
	// <= BytesTotal).
	BytesDone  int64 `json:"bytesDone"`
	BytesTotal int64 `json:"bytesTotal"`
	// RateBytesPerSecond is the step's rate over the last interval (bytes
	// per second, >= 0).
	RateBytesPerSecond int64 `json:"rateBytesPerSecond"`
	// Retry, while the step's image or piece request to the controller is
	// failing and being asked again, says which and why ("piece 12 of 64:
	// controller request stalled for 1m0s, retry 3 of 20 in 8s"); "" when
	// the bytes move. At most MaxProgressRetryBytes of printable text. A
	// report whose Retry differs from the last one counts as hearing from
	// the machine (the agent is working through a bounded retry, not
	// stuck) while less than Plan.SilentAfter has passed since its bytes
	// last moved; after that only moving bytes do. The agent sends it only to a controller whose Plan carries
	// SilentAfter: an older one refuses unknown fields.
	Retry string `json:"retry,omitempty"`
}

// MaxProgressRetryBytes bounds Progress.Retry.
const MaxProgressRetryBytes = 300

// retryRuneAllowed reports whether r may appear in Progress.Retry: any
// rune but a C0 control (below U+0020), DEL (U+007F) and U+FFFD (what
// an invalid UTF-8 byte decodes to), so the text is safe to put in a
// log line, a status file or a terminal as it is.
func retryRuneAllowed(r rune) bool {
	return r >= 0x20 && r != 0x7f && r != utf8.RuneError
}

// RetryText is s made fit for Progress.Retry: the runes it may not carry
// (C0 controls, DEL, invalid UTF-8) dropped, then cut to at most n bytes
// (n <= 0 or above MaxProgressRetryBytes: MaxProgressRetryBytes) on a
// rune boundary. CheckRetry accepts every result.
func RetryText(s string, n int) string {
	if n <= 0 || n > MaxProgressRetryBytes {
		n = MaxProgressRetryBytes
	}
	s = strings.Map(func(r rune) rune {
		if !retryRuneAllowed(r) {
			return -1
		}
		return r
	}, s)
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// CheckRetry reports whether s may be a Progress.Retry: at most
// MaxProgressRetryBytes bytes, none of the runes RetryText drops. The
// error names the length or the first rune refused.
func CheckRetry(s string) error {
	if len(s) > MaxProgressRetryBytes {
		return fmt.Errorf("retry: %d bytes, at most %d", len(s), MaxProgressRetryBytes)
	}
	for _, r := range s {
		if !retryRuneAllowed(r) {
			return fmt.Errorf("retry: %q is not printable text", r)
		}
	}
	return nil
}

// AgentReport is the commissioning report the ramdisk posts to PathAgentReport.
type AgentReport struct {
	// BootMAC is the MAC of the NIC the ramdisk booted from, lower-case colon form.
	BootMAC string `json:"bootMAC"`
	// AgentVersion is the agent build (git describe or "dev").
	AgentVersion string `json:"agentVersion,omitempty"`
	// Facts is the hardware inventory read from sysfs, procfs and DMI.
	Facts Facts `json:"facts"`
	// Tests holds one result per commissioning test, in run order.
	Tests []TestResult `json:"tests"`
	// StartedToReport is the time from kernel start (/proc/uptime) to the report.
	StartedToReport time.Duration `json:"startedToReportNs,omitempty"`
}

// Passed reports whether every test in r passed (and at least one ran).
func (r AgentReport) Passed() bool {
	if len(r.Tests) == 0 {
		return false
	}
	for _, t := range r.Tests {
		if !t.Passed {
			return false
		}
	}
	return true
}

// ReportAck is the controller's answer to a report.
type ReportAck struct {
	// Lifecycle is the state the server moved to: "ready" or "failed".
	Lifecycle string `json:"lifecycle"`
	// Reason is set when Lifecycle is "failed" (the first failed test).
	Reason string `json:"reason,omitempty"`
}

// Facts is the hardware inventory of one machine.
type Facts struct {
	CPU    CPU    `json:"cpu"`
	Memory Memory `json:"memory"`
	Disks  []Disk `json:"disks"`
	NICs   []NIC  `json:"nics"`
	DMI    DMI    `json:"dmi"`
	// GPUs are the PCI display controllers (class 03xxh) that are not a
	// BMC's own VGA (ASPEED, Matrox G200); empty when none.
	GPUs []GPU `json:"gpus,omitempty"`
}

// GPU is one PCI display controller from /sys/bus/pci/devices (PCI class
// 03h, PCI Code and ID Assignment Specification §1.4).
type GPU struct {
	// PCIAddress is the device's domain:bus:device.function ("0000:3b:00.0").
	PCIAddress string `json:"pciAddress"`
	// VendorID and DeviceID are the PCI ids in hex ("0x10de").
	VendorID string `json:"vendorID"`
	DeviceID string `json:"deviceID,omitempty"`
	// Vendor is "nvidia" (10deh), "amd" (1002h), "intel" (8086h), or the
	// vendor id when unknown.
	Vendor string `json:"vendor"`
}

// CPU is read from /proc/cpuinfo and /sys/devices/system/cpu.
type CPU struct {
	// Model is the "model name" line of the first processor.
	Model string `json:"model"`
	// Vendor is the "vendor_id" line of the first processor
	// ("GenuineIntel", "AuthenticAMD"); "" where cpuinfo has none (arm64
	// lists "CPU implementer" instead).
	Vendor string `json:"vendor,omitempty"`
	// Arch is the machine architecture as a GOARCH name ("amd64",
	// "arm64"), from /proc/sys/kernel/arch, else the agent's own build.
	Arch string `json:"arch,omitempty"`
	// SMBIOSArch is the architecture the firmware states, as a GOARCH name
	// ("386", "amd64", "arm", "arm64", "riscv64", "loong64"): the Processor
	// Architecture Type of the first SMBIOS type 44 structure (DSP0134
	// §7.45, SMBIOS 3.3+), else the Processor Family of the first populated
	// type 4 structure where the family names one architecture (§7.5.2),
	// from /sys/firmware/dmi/entries. "" when SMBIOS says neither, or from
	// agents older than the field. It can differ from Arch: a 32-bit kernel
	// on 64-bit firmware ("386" on "amd64") or a wrong report.
	SMBIOSArch string `json:"smbiosArch,omitempty"`
	// Sockets is the number of distinct physical package ids.
	Sockets int `json:"sockets"`
	// Cores is the number of distinct (package, core) pairs over all sockets.
	Cores int `json:"cores"`
	// Threads is the number of logical CPUs listed in /proc/cpuinfo.
	Threads int `json:"threads"`
	// Online is the number of CPUs in /sys/devices/system/cpu/online.
	Online int `json:"online"`
	// Flags are the flags of the first processor, sorted.
	Flags []string `json:"flags,omitempty"`
	// Virtualization is "vmx" (Intel VT-x), "svm" (AMD-V) or "" if neither flag is set.
	Virtualization string `json:"virtualization,omitempty"`
}

// Memory is read from /proc/meminfo (MemTotal) and DMI type 17 entries.
type Memory struct {
	// TotalBytes is MemTotal in bytes (kernel-visible, below installed size).
	TotalBytes int64 `json:"totalBytes"`
	// DIMMs lists populated DMI memory devices; empty when DMI has none.
	DIMMs []DIMM `json:"dimms,omitempty"`
}

// DIMM is one populated DMI type 17 (Memory Device) entry, SMBIOS 3.x §7.18.
type DIMM struct {
	Locator      string `json:"locator,omitempty"`
	SizeBytes    int64  `json:"sizeBytes"`
	Type         string `json:"type,omitempty"`
	SpeedMTs     int    `json:"speedMTs,omitempty"`
	Manufacturer string `json:"manufacturer,omitempty"`
	Serial       string `json:"serial,omitempty"`
	PartNumber   string `json:"partNumber,omitempty"`
}

// Disk is one whole block device from /sys/block (partitions excluded).
type Disk struct {
	// Name is the kernel name (sda, nvme0n1). Not stable across boots: never
	// use it as a root-device hint.
	Name      string `json:"name"`
	SizeBytes int64  `json:"sizeBytes"`
	Model     string `json:"model,omitempty"`
	Serial    string `json:"serial,omitempty"`
	// WWN is the World Wide Name (device/wwid or device/wwn), e.g. "naa.5000c500a1b2c3d4".
	WWN        string `json:"wwn,omitempty"`
	Rotational bool   `json:"rotational"`
	ReadOnly   bool   `json:"readOnly,omitempty"`
	Removable  bool   `json:"removable,omitempty"`
	// Transport is "nvme", "sata", "sas", "usb", "virtio", "scsi" or "".
	Transport string `json:"transport,omitempty"`
	// ByPath is the /dev/disk/by-path name (without the directory), e.g.
	// "pci-0000:00:1f.2-ata-1". Derived from the sysfs device path.
	ByPath string `json:"byPath,omitempty"`
	// Virtual is true for BMC virtual media and other emulated installer
	// devices (vendor strings like "Virtual", "iDRAC", "Virtual_Media").
	Virtual bool `json:"virtual,omitempty"`
}

// NIC is one physical network interface from /sys/class/net (virtual ones excluded).
type NIC struct {
	Name   string `json:"name"`
	MAC    string `json:"mac"`
	Driver string `json:"driver,omitempty"`
	// Link is true when operstate is "up" or carrier is 1.
	Link bool `json:"link"`
	// SpeedMbps is /sys/class/net/<if>/speed; 0 when unknown or link down.
	SpeedMbps int `json:"speedMbps,omitempty"`
	// LLDP is what the NIC heard from its switch port during
	// commissioning; nil when no LLDP frame came within the listen time.
	LLDP *LLDP `json:"lldp,omitempty"`
	// PCIAddress is the PCI function the NIC sits on ("0000:3b:00.0",
	// the nearest PCI device above /sys/class/net/<if>/device); "" for
	// a NIC not on PCI. Network layouts order NICs by it.
	PCIAddress string `json:"pciAddress,omitempty"`
}

// DMI is the SMBIOS identity from /sys/class/dmi/id; empty when the machine has no DMI.
type DMI struct {
	SystemVendor  string `json:"systemVendor,omitempty"`
	SystemProduct string `json:"systemProduct,omitempty"`
	SystemSerial  string `json:"systemSerial,omitempty"`
	SystemUUID    string `json:"systemUUID,omitempty"`
	BoardVendor   string `json:"boardVendor,omitempty"`
	BoardProduct  string `json:"boardProduct,omitempty"`
	BoardSerial   string `json:"boardSerial,omitempty"`
	BIOSVendor    string `json:"biosVendor,omitempty"`
	BIOSVersion   string `json:"biosVersion,omitempty"`
	BIOSDate      string `json:"biosDate,omitempty"`
}

// Commissioning test names used in TestResult.Name.
const (
	TestMemory  = "memory"
	TestDisk    = "disk"
	TestNetwork = "network"
	TestCPU     = "cpu"
)

// TestResult is the outcome of one commissioning test.
type TestResult struct {
	// Name is one of TestMemory, TestDisk, TestNetwork, TestCPU.
	Name   string `json:"name"`
	Passed bool   `json:"passed"`
	// Reason says why the test failed; empty when it passed.
	Reason string `json:"reason,omitempty"`
	// Duration is the wall-clock time the test took.
	Duration time.Duration `json:"durationNs"`
	// Metrics are test-specific numbers, e.g. "bytes", "MBps", "disks".
	Metrics map[string]float64 `json:"metrics,omitempty"`
}

// Plan is the deploy plan answered by PathAgentPlan.
type Plan struct {
	// ImageURL is an absolute http(s) URL of the raw disk image.
	ImageURL string `json:"imageURL"`
	// ImageToken authorises GETs of ImageURL (short-lived, reusable for the
	// second pass of a two-pass deploy).
	ImageToken string `json:"imageToken,omitempty"`
	// ImageSHA256 is the lower-case hex SHA-256 of the raw image bytes.
	ImageSHA256 string `json:"imageSHA256"`
	// ImageSizeBytes is the raw image size; the agent refuses a body of any other length.
	ImageSizeBytes int64 `json:"imageSizeBytes"`
	// RootDevice picks the target disk; the zero value means "smallest disk that fits".
	RootDevice RootDeviceHint `json:"rootDevice"`
	// Storage, when set, is the layout made before the write (the image
	// goes to its root device; RootDevice is then unused).
	Storage *StoragePlan `json:"storage,omitempty"`
	// ReadBack asks for a read-back verification after the write.
	ReadBack bool `json:"readBack,omitempty"`
	// Seed is the cloud-init NoCloud seed written after the image.
	Seed Seed `json:"seed"`
	// DoneToken authorises the single POST to PathAgentDone.
	DoneToken string `json:"doneToken,omitempty"`
	// ProgressEvery is how often the agent posts a Progress to
	// PathAgentProgress (with ImageToken) during the image's download,
	// write and read-back; zero means it posts none (a controller older
	// than progress reports).
	ProgressEvery time.Duration `json:"progressEveryNs,omitempty"`
	// SilentAfter is the controller's patience with this deploy: a
	// machine not heard from for this long is network-booted again
	// (machina serve --machine-silent-after). The agent reports each
	// retry of an image or piece request that keeps failing (stalled,
	// refused, reset) in Progress.Retry, which the controller hears, and
	// starts no retry later than SilentAfter less ProgressEvery after the
	// request's first attempt (of the last byte received, for the whole
	// image): it then reports the failure to done, naming the request,
	// the cause and the attempts, so the controller learns the cause
	// rather than taking the machine for silent. Zero (a controller older
	// than this field): the requests are bounded by their attempt count
	// only, and Progress.Retry and PieceStats.DroppedPeers are not sent.
	SilentAfter time.Duration `json:"silentAfterNs,omitempty"`
	// Pieces is the image's piece manifest and Wave the peers sharing it
	// (api/v1/pieces.go); nil from a controller without piece sharing.
	Pieces *PieceManifest `json:"pieces,omitempty"`
	Wave   *Wave          `json:"wave,omitempty"`
}

// RootDeviceHint names the target disk, after metal3's rootDeviceHints. All
// set fields must match. A kernel name (DeviceName like "/dev/sda") is
// refused: it is not stable across boots.
type RootDeviceHint struct {
	Serial string `json:"serial,omitempty"`
	WWN    string `json:"wwn,omitempty"`
	// ByPath is a /dev/disk/by-path name, with or without the directory.
	ByPath string `json:"byPath,omitempty"`
	// MinSizeBytes is the smallest acceptable disk size.
	MinSizeBytes int64 `json:"minSizeBytes,omitempty"`
	// DeviceName is accepted on the wire only to be refused with a clear error.
	DeviceName string `json:"deviceName,omitempty"`
}

// Seed is the content of the NoCloud seed (cloud-init "nocloud" datasource).
type Seed struct {
	// InstanceID is meta-data instance-id; a new value makes cloud-init run again.
	InstanceID string `json:"instanceID"`
	// Hostname is meta-data local-hostname (RFC 1123 label).
	Hostname string `json:"hostname"`
	// SSHKeys are the authorized keys of user "machina" (one OpenSSH public key each).
	SSHKeys []string `json:"sshKeys"`
	// NetworkConfig is a network-config v2 document (YAML); empty means DHCP on all NICs.
	NetworkConfig string `json:"networkConfig,omitempty"`
	// JoinCommand is the first-boot join command run by runcmd; one line.
	// Empty means [JoinPlaceholder].
	JoinCommand string `json:"joinCommand,omitempty"`
	// JoinToken, when set, is the enrolment token JoinCommand reads from
	// JoinTokenPath: the seed writes it there (cloud-init write_files,
	// mode 0600, root) and the command removes the file when it exits, so
	// the token is never on a command line (/proc/PID/cmdline) or in
	// cloud-init's logs. URL-safe base64, 16-128 characters.
	JoinToken string `json:"joinToken,omitempty"`
	// UserData is the profile's own cloud-config (a JSON object), merged
	// into the seed's user-data after Machina's parts: its users,
	// write_files and runcmd entries come after Machina's (the join
	// command runs first), its other keys are added; ssh_pwauth,
	// disable_root, a user named machina and a write_files entry at
	// JoinTokenPath are refused. Empty: none. At most 64 KiB.
	UserData json.RawMessage `json:"userData,omitempty"`
	// VendorData is the profile's vendor-data (a cloud-config JSON
	// object), written as the seed's vendor-data file under the same
	// refusals; cloud-init lets user-data override it. Empty: none.
	VendorData json.RawMessage `json:"vendorData,omitempty"`
}

// JoinPlaceholder is the first-boot command written into a NoCloud seed
// (Seed.JoinCommand) or an installer document when no join command is given.
// It only records that the join step is missing. It lives here because the
// controller (which sends it), deploy (installer documents) and the ramdisk
// agent (the seed) all need it, and api/v1 is the one package all three may
// import (docs/architecture.md).
const JoinPlaceholder = "echo 'machina: join command placeholder, replaced by the join issue' >> /var/log/machina-join.log"

// JoinTokenPath is where a deployed host's first boot finds its enrolment
// token (Seed.JoinToken; the installer documents write the same file): on
// the root filesystem, because a kickstart's %post writes it before the
// reboot; mode 0600, removed by the join command after use.
const JoinTokenPath = "/var/lib/machina/join-token"

// WipePlan is the release wipe plan answered by PathAgentWipe: which disks
// to wipe and the token for the outcome.
type WipePlan struct {
	// RootDevice, when non-zero, names the one disk to wipe (the inventory's
	// root device hint, the disk the deploy wrote). The zero value means
	// every eligible disk (the disks a deploy may write: not read-only,
	// removable, USB or virtual media, nor the ramdisk's own source).
	RootDevice RootDeviceHint `json:"rootDevice"`
	// DoneToken authorises the single POST to PathAgentWiped.
	DoneToken string `json:"doneToken"`
	// Erase is the released profile's erase method: EraseMetadata ("" means
	// it), EraseDiscard, EraseZero or EraseSecure.
	Erase string `json:"erase,omitempty"`
	// EraseDisks, when set, is each commissioned disk's own method (the
	// profile's eraseOverrides, chosen at allocation); Erase is then only
	// the default they were chosen from. The agent finds each disk it
	// wipes here by the entry's by-path, WWN or serial (the first set) and
	// refuses the wipe when a disk is not listed, since its method was
	// never chosen; empty means Erase for every disk.
	EraseDisks []EraseDisk `json:"eraseDisks,omitempty"`
	// ProgressToken (reusable, not consumed) authorises the StepErase
	// reports to PathAgentProgress every ProgressEvery; zero ProgressEvery
	// means none.
	ProgressToken string        `json:"progressToken,omitempty"`
	ProgressEvery time.Duration `json:"progressEveryNs,omitempty"`
}

// Erase methods of WipePlan.Erase (profiles.yaml erase), weakest first.
const (
	EraseMetadata = "metadata" // partition tables and signatures only
	EraseDiscard  = "discard"  // BLKSECDISCARD, else BLKDISCARD, of every block
	EraseZero     = "zero"     // zeros over the whole device, samples read back
	EraseSecure   = "secure"   // NVMe Format (user data erase) or ATA SECURITY ERASE UNIT
)

// EraseDisk is one disk's erase method in a WipePlan: the disk as
// commissioning reported it (StorageDiskRef: found by its by-path, WWN or
// serial) and EraseMetadata, EraseDiscard, EraseZero or EraseSecure.
type EraseDisk struct {
	Disk   StorageDiskRef `json:"disk"`
	Method string         `json:"method"`
}

// DiskErase is one disk's erase outcome in a WipeResult.
type DiskErase struct {
	// Disk is the stable identity (as WipeResult.Disks); Name the kernel name.
	Disk string `json:"disk"`
	Name string `json:"name,omitempty"`
	// Method is what ran: "metadata", "discard", "secure-discard", "zero",
	// "nvme-format-user-data-erase" or "ata-security-erase"
	// ("ata-enhanced-security-erase").
	Method string `json:"method"`
	// Bytes is the device size erased; Duration the erase's wall time.
	Bytes    int64         `json:"bytes"`
	Duration time.Duration `json:"durationNs"`
	// VerifiedSamples is how many sample blocks spread over the device were
	// read back and found erased (zero for "zero"; no longer their old
	// content for the others); 0 for "metadata".
	VerifiedSamples int `json:"verifiedSamples,omitempty"`
}

// WipeResult is posted to PathAgentWiped after a wipe attempt.
type WipeResult struct {
	BootMAC string `json:"bootMAC"`
	OK      bool   `json:"ok"`
	// Reason says why the wipe failed; empty when OK.
	Reason string `json:"reason,omitempty"`
	// Disks are the wiped disks' stable identities (by-path, WWN, serial or
	// kernel name, the first one known).
	Disks    []string      `json:"disks,omitempty"`
	Duration time.Duration `json:"durationNs"`
	// Erased holds each erased disk's outcome, in order.
	Erased []DiskErase `json:"erased,omitempty"`
	// Unsupported says the failure is a disk that cannot do the plan's
	// erase method (Reason names it and why): no weaker method was run.
	Unsupported bool `json:"unsupported,omitempty"`
}

// DeployResult is posted to PathAgentDone after a deploy attempt.
type DeployResult struct {
	BootMAC string `json:"bootMAC"`
	OK      bool   `json:"ok"`
	// Reason says why the deploy failed; empty when OK.
	Reason string `json:"reason,omitempty"`
	// Disk is the target's stable identity (by-path, serial or WWN), never only its kernel name.
	Disk     string `json:"disk,omitempty"`
	DiskName string `json:"diskName,omitempty"`
	// BytesWritten is the number of image bytes written; the controller
	// requires the plan's ImageSizeBytes.
	BytesWritten int64 `json:"bytesWritten"`
	// SHA256 is the lower-case hex digest of the image bytes the agent
	// received and wrote; the controller requires the plan's ImageSHA256.
	SHA256 string `json:"sha256,omitempty"`
	// ReadBackSHA256 is the digest the agent computed reading the written
	// range back from the disk; required when the plan asked for ReadBack.
	ReadBackSHA256 string        `json:"readBackSHA256,omitempty"`
	Duration       time.Duration `json:"durationNs"`
	// Mode is "memory" (image buffered then written) or "two-pass".
	Mode string `json:"mode,omitempty"`
	// FailedStep and FailedDevice name the storage layout step that failed
	// ("mdadm-create", "lvcreate", ...) and its device; empty otherwise.
	FailedStep   string `json:"failedStep,omitempty"`
	FailedDevice string `json:"failedDevice,omitempty"`
	// Pieces says where the image's bytes came from, when the plan had a
	// piece manifest.
	Pieces *PieceStats `json:"pieces,omitempty"`
}
