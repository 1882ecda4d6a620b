// Package inventory holds the Go types of Machina's desired state, the strict
// parser of an inventory repository snapshot (servers.yaml, profiles.yaml,
// images.yaml) that keeps the file, line and column of every field, and the
// cross-file checks a JSON Schema cannot express.
//
// A revision is either wholly valid ([Load] returns an [Inventory]) or
// rejected with every problem at once ([*ValidationError]); nothing is ever
// half-applied. inventory imports only package schema.
package inventory

import (
	"strconv"
	"strings"
)

// File names of the inventory inside a repository (at its root).
const (
	ServersFile  = "servers.yaml"
	ProfilesFile = "profiles.yaml"
	ImagesFile   = "images.yaml"
)

// Inventory is one validated, normalised revision of the desired state.
type Inventory struct {
	Servers  []Server  `json:"servers"`
	Profiles []Profile `json:"profiles"`
	Images   []Image   `json:"images"`
	// FirmwareImages is images.yaml's firmware catalog: the BMC update
	// files profiles' firmware versions name (FirmwareImage).
	FirmwareImages []FirmwareImage `json:"firmware,omitempty"`
	// Subnets are networks.yaml's (see networks.go); nil without the file.
	Subnets []Subnet `json:"subnets,omitempty"`
	// Digest is "sha256:" and the hex SHA-256 of the canonical JSON of the
	// three lists. Two revisions with the same desired state share a digest,
	// whatever their commits, comments or formatting.
	Digest string `json:"-"`
}

// Server returns the server named name, or nil.
func (inv *Inventory) Server(name string) *Server {
	for i := range inv.Servers {
		if inv.Servers[i].Name == name {
			return &inv.Servers[i]
		}
	}
	return nil
}

// Profile returns the profile named name, or nil.
func (inv *Inventory) Profile(name string) *Profile {
	for i := range inv.Profiles {
		if inv.Profiles[i].Name == name {
			return &inv.Profiles[i]
		}
	}
	return nil
}

// Image returns the image named name, or nil.
func (inv *Inventory) Image(name string) *Image {
	for i := range inv.Images {
		if inv.Images[i].Name == name {
			return &inv.Images[i]
		}
	}
	return nil
}

// Want is the desired lifecycle of a server.
type Want string

// Desired lifecycles. The zero value in a file means WantReady.
const (
	WantReady    Want = "ready"
	WantDeployed Want = "deployed"
	WantRetired  Want = "retired"
)

// BootMode is the server's firmware interface.
type BootMode string

// Boot modes. The zero value in a file means BootUEFI.
const (
	BootUEFI BootMode = "uefi"
	BootBIOS BootMode = "bios"
)

// BMCDriver is the BMC protocol.
type BMCDriver string

// BMC drivers.
const (
	DriverRedfish BMCDriver = "redfish"
	DriverIPMI    BMCDriver = "ipmi"
)

// Architectures, as Go names them (GOARCH): servers.yaml arch, images.yaml
// arch, and what commissioning reports.
const (
	ArchAMD64 = "amd64"
	ArchARM64 = "arm64"
)

// Server is one machine of servers.yaml, normalised: BootMAC in lower-case
// colon form, BootMode and Want defaulted.
type Server struct {
	Name string   `json:"name"`
	Zone string   `json:"zone"`
	Site string   `json:"site,omitempty"`
	Rack string   `json:"rack,omitempty"`
	Tags []string `json:"tags,omitempty"`
	// Labels are the stated labels (see [StatedLabels] for how tags join
	// them); keys and values follow the Kubernetes label rules.
	Labels   map[string]string `json:"labels,omitempty"`
	BootMAC  string            `json:"bootMAC"`
	BootMode BootMode          `json:"bootMode,omitempty"`
	// TPM pins the server's TPM 2.0 endorsement key; nil pins none.
	TPM *TPM `json:"tpm,omitempty"`
	// Arch is the machine's stated architecture, amd64 or arm64 (GOARCH
	// names); "" leaves it to commissioning. Allocation uses the reported
	// architecture once there is one and shows a condition where the two
	// differ.
	Arch       string      `json:"arch,omitempty"`
	BMC        BMC         `json:"bmc,omitzero"`
	Want       Want        `json:"want,omitempty"`
	Profile    string      `json:"profile,omitempty"`
	RootDevice *RootDevice `json:"rootDevice,omitempty"`
	Actions    Actions     `json:"actions,omitempty"`
	// Fence is a fencing device separate from the BMC (a PDU's or a
	// chassis manager's IPMI or Redfish endpoint) that powers this server
	// off when its host is fenced; nil fences through BMC.
	Fence *BMC `json:"fence,omitempty"`
	// NICs are the NICs whose cabling commissioning checks (cabling.go).
	NICs []ServerNIC `json:"nics,omitempty"`
	// Network is this server's part of its profile's network layout
	// (fixed addresses, NIC matches); nil for none. See networks.go.
	Network *ServerNetwork `json:"network,omitempty"`
}

// BMC says how to reach a server's baseboard management controller. Address
// is a Redfish base URL or an IPMI host[:port]; Credentials names a secret in
// the controller's store and never holds one. The zero BMC (no `bmc` block,
// as on an auto-enrolled server's proposed entry) means the server has none
// Machina knows of: see [BMC.IsZero].
type BMC struct {
	Driver      BMCDriver `json:"driver"`
	Address     string    `json:"address"`
	Credentials string    `json:"credentials"`
	SystemID    string    `json:"systemID,omitempty"`
	InsecureTLS bool      `json:"insecureTLS,omitempty"`
	// Auth is the Redfish authentication scheme: "" or "auto" (session,
	// falling back to HTTP Basic), "session" or "basic".
	Auth string `json:"auth,omitempty"`
	// CABundle names a secret whose PEM certificates (a CA or the BMC's
	// self-signed certificate) are trusted for this BMC's TLS; "" uses the
	// system roots. Never the PEM itself.
	CABundle string `json:"caBundle,omitempty"`
	// MinCipherSuite is IPMI only: the weakest RMCP+ cipher suite this
	// BMC's sessions may run with, 3 or 17, judged by the algorithms the
	// BMC answers with; 0 uses the controller's --ipmi-min-cipher-suite
	// (default 3). For a BMC that cannot do what the site asks.
	MinCipherSuite uint8 `json:"minCipherSuite,omitempty"`
}

// IsZero reports whether b is the zero BMC: the server has no `bmc` block,
// so Machina cannot power it or set its boot device (validate warns; attach
// one with `machinactl server bmc-set`).
func (b BMC) IsZero() bool { return b == BMC{} }

// RootDevice names the deploy disk by stable identifiers only.
type RootDevice struct {
	Serial     string `json:"serial,omitempty"`
	WWN        string `json:"wwn,omitempty"`
	ByPath     string `json:"byPath,omitempty"`
	MinSizeGiB int64  `json:"minSizeGiB,omitempty"`
}

// Actions are one-off action counters: the reconciler performs an action
// once each time its desired counter exceeds the observed one.
type Actions struct {
	Commission int64 `json:"commission,omitempty"`
	PowerCycle int64 `json:"powerCycle,omitempty"`
	PowerOn    int64 `json:"powerOn,omitempty"`
	PowerOff   int64 `json:"powerOff,omitempty"`
}

// DeployMethod is how a profile installs its OS.
type DeployMethod string

// Deploy methods. The zero value in a file means DeployImage.
const (
	DeployImage       DeployMethod = "image"
	DeployAutoinstall DeployMethod = "autoinstall"
	DeployKickstart   DeployMethod = "kickstart"
)

// Profile is one kind of machine of profiles.yaml.
type Profile struct {
	Name    string       `json:"name"`
	Image   string       `json:"image"`
	Deploy  DeployMethod `json:"deploy,omitempty"`
	SSHKeys []string     `json:"sshKeys,omitempty"`
	// Zone restricts allocation to servers of this zone; "" means any.
	// Attestation is the TPM attestation policy of the profile's servers:
	// "required", "optional" or "off"; "" means optional.
	Attestation string `json:"attestation,omitempty"`
	Zone        string `json:"zone,omitempty"`
	Min         Min    `json:"min,omitempty"`
	Count       int    `json:"count,omitempty"`
	Join        Join   `json:"join,omitempty"`
	// Selector narrows allocation to servers whose labels (stated, tags
	// and derived) match; nil means any server.
	Selector *Selector `json:"selector,omitempty"`
	// Fence is the fencing policy of the profile's hosts: FenceOff (the
	// default, "" in a file) or FenceAuto.
	Fence FencePolicy `json:"fence,omitempty"`
	// Firmware is the firmware state the profile's servers must have
	// before their image is written (BIOS settings, RAID volumes,
	// component versions, Secure Boot); nil asks for nothing. See
	// docs/firmware.md "Firmware in profiles".
	Firmware *Firmware `json:"firmware,omitempty"`
	// Erase is how the ramdisk erases the disks of a server released from
	// this profile: EraseMetadata (the default, "" in a file), EraseDiscard,
	// EraseZero or EraseSecure. See docs/storage.md "Erase on release".
	Erase EraseMethod `json:"erase,omitempty"`
	// EraseOverrides give disks chosen by their commissioning facts
	// another erase method than Erase (secure for NVMe, zero for the
	// rest): a disk takes the first override that matches it (PlanErase).
	// See docs/storage.md "Erase on release".
	EraseOverrides []EraseOverride `json:"eraseOverrides,omitempty"`
	// Network is the interface layout the profile's hosts come up with
	// (rendered as cloud-init network-config v2); nil keeps DHCP on the
	// boot NIC. CloudInit is the operator's own user-data and
	// vendor-data. See networks.go and docs/networks.md.
	Network   *NetworkLayout `json:"network,omitempty"`
	CloudInit *CloudInit     `json:"cloudInit,omitempty"`
	// Storage is the disk layout the ramdisk makes before the image is
	// written (RAID1 root, volume groups); nil writes one disk as before.
	// See docs/storage.md.
	Storage *Storage `json:"storage,omitempty"`

	// ShareAcrossZones lets the profile's deploying machines share image
	// pieces across zones (docs/ramdisk.md "Deploy waves"); false keeps
	// every deploy wave inside one zone.
	ShareAcrossZones bool `json:"shareAcrossZones,omitempty"`
}

// EraseMethod is how a released server's disks are erased (api/v1
// WipePlan.Erase carries it to the ramdisk).
type EraseMethod string

// Erase methods, weakest first. A method a disk cannot do fails the erase
// (the server stays held); the agent never falls back to a weaker one.
const (
	// EraseMetadata clears partition tables and signatures only.
	EraseMetadata EraseMethod = "metadata"
	// EraseDiscard discards every block (BLKSECDISCARD where the device
	// supports it, else BLKDISCARD).
	EraseDiscard EraseMethod = "discard"
	// EraseZero writes zeros over the whole device and reads samples back.
	EraseZero EraseMethod = "zero"
	// EraseSecure runs the drive's own erase: NVMe Format with Secure
	// Erase Settings 1 (user data erase), or ATA SECURITY ERASE UNIT.
	EraseSecure EraseMethod = "secure"
)

// EraseOverride is one entry of Profile.EraseOverrides: the erase method
// of the disks Disks matches (the storage layout's selector, DiskMatch,
// with MinSizeGiB as a least size).
type EraseOverride struct {
	Disks  DiskMatch   `json:"disks"`
	Method EraseMethod `json:"method"`
}

// Firmware is a profile's desired firmware state, in Redfish terms (the
// shape of Metal3's HostFirmwareSettings, HostFirmwareComponents and RAID
// spec): each part is optional, and only what it names is changed.
type Firmware struct {
	// Settings are BIOS attributes by their vendor name (the System's
	// Bios resource Attributes, DSP0268 Bios 1.x) and the value wanted:
	// a string, a number (float64 after decoding) or a bool. The plan
	// checks each against the machine's AttributeRegistry before any is
	// sent.
	Settings map[string]any `json:"settings,omitempty"`
	// RAID lists the volumes to create on the hardware RAID controller
	// (Redfish Storage Volumes); Machina deletes only the volumes it
	// created, on release.
	RAID []RAIDVolume `json:"raid,omitempty"`
	// Versions lists firmware components (FirmwareInventory members) and
	// the version each must run, with the image that carries it.
	Versions []FirmwareVersion `json:"versions,omitempty"`
	// SecureBoot is the wanted SecureBootEnable of the System's
	// SecureBoot resource; nil leaves it as it is.
	SecureBoot *bool `json:"secureBoot,omitempty"`
}

// RAID levels a profile may ask for (Redfish Volume RAIDType values).
const (
	RAID0  = "RAID0"
	RAID1  = "RAID1"
	RAID5  = "RAID5"
	RAID6  = "RAID6"
	RAID10 = "RAID10"
)

// RAIDMinDrives is the fewest member drives each RAID level takes (SNIA
// DDF 2.0 §4.2: mirror 2, single parity 3, dual parity 4, striped mirror
// 4); RAID10 also needs an even count.
var RAIDMinDrives = map[string]int{RAID0: 1, RAID1: 2, RAID5: 3, RAID6: 4, RAID10: 4}

// SizeAll is RAIDVolume.Size for a volume over the whole capacity of its
// drives.
const SizeAll = "all"

// RAIDVolume is one logical drive on the RAID controller.
type RAIDVolume struct {
	// Name is the volume's Name on the controller (and how Machina
	// recognises the volumes it created).
	Name  string `json:"name"`
	Level string `json:"level"`
	// Drives chooses the member drives by what the controller reports of
	// them (Redfish Drive MediaType and CapacityBytes).
	Drives DriveSelector `json:"drives"`
	// Size is SizeAll, or a size in GiB or TiB ("500GiB", "2TiB").
	Size string `json:"size"`
}

// SizeBytes returns the volume size in bytes; 0 for SizeAll.
func (v RAIDVolume) SizeBytes() int64 {
	n, unit := v.Size, int64(0)
	switch {
	case strings.HasSuffix(n, "GiB"):
		n, unit = strings.TrimSuffix(n, "GiB"), 1<<30
	case strings.HasSuffix(n, "TiB"):
		n, unit = strings.TrimSuffix(n, "TiB"), 1<<40
	default:
		return 0
	}
	v64, err := strconv.ParseInt(n, 10, 64)
	if err != nil {
		return 0
	}
	return v64 * unit
}

// DriveSelector picks Count drives of MediaType ("HDD" or "SSD"; "" for
// either) with at least MinSizeGiB GiB each (0: any size).
type DriveSelector struct {
	Count      int    `json:"count"`
	MediaType  string `json:"mediaType,omitempty"`
	MinSizeGiB int64  `json:"minSizeGiB,omitempty"`
}

// FirmwareVersion is one component's wanted version and the update image
// that carries it: Image names an entry of images.yaml's firmware catalog
// (FirmwareImage), which the controller imports, verifies and serves to
// the BMC over HTTP as UpdateService.SimpleUpdate's ImageURI (or pushes to
// its MultipartHttpPushUri).
type FirmwareVersion struct {
	// Component is the FirmwareInventory member's Id or Name ("BIOS",
	// "BMC", a NIC's firmware).
	Component string `json:"component"`
	Version   string `json:"version"`
	Image     string `json:"image"`
}

// FirmwareImage is one entry of images.yaml's firmware catalog: a
// vendor's update file, imported as it is (no conversion) and checked
// against Checksum ("sha256:" and 64 hex digits) and SizeBytes before it
// is stored, and its checksum again before each offer to a BMC.
type FirmwareImage struct {
	Name string `json:"name"`
	// URL is where the controller downloads the file; the last path
	// segment is the file name the BMC is offered (vendors' BMCs check
	// it: iDRAC's .exe/.d9, iLO's .fwpkg, XCC's .uxz).
	URL       string `json:"url"`
	Checksum  string `json:"checksum"`
	SizeBytes int64  `json:"sizeBytes"`
}

// FirmwareImage returns the firmware catalog entry named name, or nil.
func (inv *Inventory) FirmwareImage(name string) *FirmwareImage {
	for i := range inv.FirmwareImages {
		if inv.FirmwareImages[i].Name == name {
			return &inv.FirmwareImages[i]
		}
	}
	return nil
}

// FencePolicy says whether a lost host is fenced without an operator.
type FencePolicy string

// Fencing policies. FenceAuto fences a host lost for the controller's
// second window (its server powered off, read back), only while the
// safety brake's share of hosts allows it.
const (
	FenceOff  FencePolicy = "off"
	FenceAuto FencePolicy = "auto"
)

// Min is the smallest machine a profile accepts. Zero fields mean no minimum.
type Min struct {
	Cores     int   `json:"cores,omitempty"`
	MemoryGiB int64 `json:"memoryGiB,omitempty"`
	DiskGiB   int64 `json:"diskGiB,omitempty"`
}

// Join is what a profile's hosts carry into the fleet on their enrolment token.
type Join struct {
	Site         string        `json:"site,omitempty"`
	Tags         []string      `json:"tags,omitempty"`
	Networks     []Network     `json:"networks,omitempty"`
	StoragePools []StoragePool `json:"storagePools,omitempty"`
	// Require lists the host checks that must pass: "kvm", "virt", "memory".
	Require []string `json:"require,omitempty"`
}

// Network is a Linux bridge over a NIC, optionally on an 802.1Q VLAN.
type Network struct {
	Name   string `json:"name"`
	Bridge string `json:"bridge"`
	NIC    string `json:"nic"`
	VLAN   int    `json:"vlan,omitempty"`
	CIDR   string `json:"cidr,omitempty"`
}

// StoragePool is a directory pool (Path) or an LVM volume group (Disks).
type StoragePool struct {
	Name  string   `json:"name"`
	Type  string   `json:"type"`
	Path  string   `json:"path,omitempty"`
	Disks []string `json:"disks,omitempty"`
}

// Image is one entry of images.yaml: a catalog entry, or a URL with a
// checksum ("sha256:..."/"sha512:...", lower-case hex) or checksum-file URL.
type Image struct {
	Name        string `json:"name"`
	Catalog     string `json:"catalog,omitempty"`
	Arch        string `json:"arch,omitempty"`
	Mirror      string `json:"mirror,omitempty"`
	URL         string `json:"url,omitempty"`
	Checksum    string `json:"checksum,omitempty"`
	ChecksumURL string `json:"checksumURL,omitempty"`
}
