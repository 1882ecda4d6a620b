package state

import (
	"maps"
	"slices"
	"time"
)

// Firmware is what the controller last read of a server's firmware through
// its BMC: the BIOS attributes and their registry, the storage
// controllers with drives and volumes, the firmware inventory and Secure
// Boot (Redfish Bios, AttributeRegistry, Storage, UpdateService
// FirmwareInventory, SecureBoot). The plan checks a profile's firmware
// block against it; status shows a summary. Kept compact: a registry
// attribute holds only what a check needs. state is a leaf, so these are
// the store's own copies of the bmc contract's types.
type Firmware struct {
	// ReadAt is when it was read (UTC).
	ReadAt time.Time `json:"readAt"`
	// BIOS is nil when the BMC has no Bios resource (or it was not read);
	// Storage, Components and SecureBoot likewise, each with its reason
	// in Unsupported.
	BIOS       *FirmwareBIOS       `json:"bios,omitempty"`
	Storage    []StorageController `json:"storage,omitempty"`
	Components []FirmwareComponent `json:"components,omitempty"`
	SecureBoot *SecureBootState    `json:"secureBoot,omitempty"`
	// Unsupported maps an area ("bios", "raid", "versions",
	// "secureBoot") the BMC has no resource for to why ("the BMC is
	// IPMI", "no UpdateService"); empty when every area was read.
	Unsupported map[string]string `json:"unsupported,omitempty"`
	// CreatedVolumes are the volumes Machina created ("controller/volume"
	// IDs), deleted on release; volumes it did not create are never
	// touched.
	CreatedVolumes []string `json:"createdVolumes,omitempty"`
}

// Firmware areas, the keys of Firmware.Unsupported and of a profile's
// firmware block.
const (
	FirmwareAreaBIOS       = "bios"
	FirmwareAreaRAID       = "raid"
	FirmwareAreaVersions   = "versions"
	FirmwareAreaSecureBoot = "secureBoot"
)

// FirmwareBIOS is the BIOS as read: the values in effect, those pending
// for the next reset, and the registry they are checked against. A stored
// reading is read-only: its values, Pending map and registry are shared
// between copies of the record (Firmware.Clone), and between records
// wherever equal (serverCache); a new reading replaces it whole.
type FirmwareBIOS struct {
	// Attributes are the values in effect (BIOSValues: string, int64,
	// float64, bool, or nil for a Password); JSON as an object.
	Attributes BIOSValues `json:"attributes,omitzero"`
	// Pending are the settings written but not applied yet.
	Pending map[string]any `json:"pending,omitempty"`
	// RegistryID is the AttributeRegistry's Id; "" with no registry.
	RegistryID string `json:"registryID,omitempty"`
	// Registry is sorted by Name; nil when the BMC publishes none.
	Registry []BIOSAttribute `json:"registry,omitempty"`
	// ApplyTimes are the SupportedApplyTimes of the settings object.
	ApplyTimes []string `json:"applyTimes,omitempty"`
}

// BIOSAttribute is one registry attribute (Redfish AttributeRegistry
// Attributes[]): its Type is Enumeration, String, Integer, Boolean or
// Password; Values the allowed ValueNames of an Enumeration; Min and Max
// bound an Integer's value or a String's length (nil: unbounded).
type BIOSAttribute struct {
	Name          string   `json:"n"`
	Type          string   `json:"t"`
	Values        []string `json:"v,omitempty"`
	Min           *int64   `json:"min,omitempty"`
	Max           *int64   `json:"max,omitempty"`
	ReadOnly      bool     `json:"ro,omitempty"`
	ResetRequired bool     `json:"rr,omitempty"`
}

// StorageController is one Redfish Storage resource with its drives and
// volumes.
type StorageController struct {
	ID string `json:"id"`
	// RAIDTypes are the levels it can create; empty when it does not say.
	RAIDTypes        []string       `json:"raidTypes,omitempty"`
	CanCreateVolumes bool           `json:"canCreateVolumes,omitempty"`
	Drives           []StorageDrive `json:"drives,omitempty"`
	Volumes          []Volume       `json:"volumes,omitempty"`
}

// StorageDrive is one physical drive: MediaType "HDD", "SSD" or "".
type StorageDrive struct {
	ID            string `json:"id"`
	CapacityBytes int64  `json:"capacityBytes,omitempty"`
	MediaType     string `json:"mediaType,omitempty"`
}

// Volume is one logical drive; Drives are the member drive IDs.
type Volume struct {
	ID            string   `json:"id"`
	Name          string   `json:"name,omitempty"`
	RAIDType      string   `json:"raidType,omitempty"`
	CapacityBytes int64    `json:"capacityBytes,omitempty"`
	Drives        []string `json:"drives,omitempty"`
}

// FirmwareComponent is one FirmwareInventory member.
type FirmwareComponent struct {
	ID         string `json:"id"`
	Name       string `json:"name,omitempty"`
	Version    string `json:"version,omitempty"`
	Updateable bool   `json:"updateable,omitempty"`
}

// SecureBootState is SecureBootEnable and SecureBootCurrentBoot
// ("Enabled", "Disabled" or "").
type SecureBootState struct {
	Enable      bool   `json:"enable"`
	CurrentBoot string `json:"currentBoot,omitempty"`
}

// Clone returns a copy of f whose slices and maps are copied, except the
// BIOS reading's Attributes (immutable), Pending and Registry, and the
// firmware inventory (Components), which are shared: they are the
// largest part of a server's record (an iDRAC 9 or iLO 5 registry has
// hundreds of attributes, its inventory about 30 components) and a
// reading is replaced whole when the BMC is read again (reconciler's
// firmware read builds new ones), never edited in place, so every holder
// of a copy must treat Pending, Registry and Components as read-only.
// Copying them made each planning pass's snapshot of a 10,000-server
// fleet allocate about 60 MB (BenchmarkSnapshotFirmware).
func (f *Firmware) Clone() *Firmware {
	if f == nil {
		return nil
	}
	c := *f
	if f.BIOS != nil {
		b := *f.BIOS
		b.ApplyTimes = slices.Clone(b.ApplyTimes)
		c.BIOS = &b
	}
	c.Storage = slices.Clone(f.Storage)
	for i := range c.Storage {
		c.Storage[i].RAIDTypes = slices.Clone(c.Storage[i].RAIDTypes)
		c.Storage[i].Drives = slices.Clone(c.Storage[i].Drives)
		c.Storage[i].Volumes = slices.Clone(c.Storage[i].Volumes)
		for j := range c.Storage[i].Volumes {
			c.Storage[i].Volumes[j].Drives = slices.Clone(c.Storage[i].Volumes[j].Drives)
		}
	}
	if f.SecureBoot != nil {
		sb := *f.SecureBoot
		c.SecureBoot = &sb
	}
	c.Unsupported = maps.Clone(f.Unsupported)
	c.CreatedVolumes = slices.Clone(f.CreatedVolumes)
	return &c
}
