package bmc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"
)

// This file is the firmware part of the contract: BIOS settings against the
// BMC's attribute registry, RAID volumes, the firmware inventory and
// updates, and UEFI Secure Boot. Each area is an optional capability a
// Driver may implement; callers detect it with a type assertion:
//
//	bc, ok := d.(bmc.BIOSConfigurer)
//	if !ok { /* the BMC cannot do it: report FirmwareUnsupported */ }
//
// bmc/redfish implements all four (DMTF Redfish DSP0268: Bios,
// AttributeRegistry, Storage/Volume, UpdateService, SecureBoot, Task);
// bmc/ipmi implements none (IPMI v2.0 has no BIOS attribute, volume or
// firmware inventory model). A Redfish BMC that lacks one area (no Bios
// resource, no Storage, no UpdateService, no SecureBoot) answers that
// area's methods with an error wrapping ErrUnsupported.
//
// The peers are Ironic's bios, raid and firmware interfaces and Metal3's
// HostFirmwareSettings, FirmwareSchema and HostFirmwareComponents.

// ErrAttributeRefused: a BIOS setting was refused by the attribute registry
// (unknown attribute, wrong type, value not allowed, out of range,
// read-only), by the driver before sending or by the BMC itself. See
// *AttributeError for the attribute and the allowed values. Not retried:
// the profile needs fixing.
var ErrAttributeRefused = errors.New("bmc: bios attribute refused")

// AttributeType is a BIOS attribute's type as the Redfish AttributeRegistry
// names it (AttributeRegistry v1 Attributes.Type).
type AttributeType string

// Attribute types (AttributeRegistry.AttributeType enum). Password values
// are write-only: the BMC reads them back as null.
const (
	AttrEnumeration AttributeType = "Enumeration"
	AttrString      AttributeType = "String"
	AttrInteger     AttributeType = "Integer"
	AttrBoolean     AttributeType = "Boolean"
	AttrPassword    AttributeType = "Password"
)

// BIOSAttribute is one attribute of the BIOS attribute registry (Redfish
// AttributeRegistry Attributes[], the peer of Metal3's FirmwareSchema
// SettingSchema).
type BIOSAttribute struct {
	// Name is AttributeName, the key in Bios.Attributes.
	Name string `json:"name"`
	// Type is the attribute's type.
	Type AttributeType `json:"type"`
	// DisplayName is the BMC's label, "" when none.
	DisplayName string `json:"displayName,omitempty"`
	// AllowedValues are the ValueName of each Enumeration value, in the
	// registry's order; empty for other types.
	AllowedValues []string `json:"allowedValues,omitempty"`
	// LowerBound and UpperBound bound an Integer (inclusive); nil when the
	// registry gives none.
	LowerBound *int64 `json:"lowerBound,omitempty"`
	UpperBound *int64 `json:"upperBound,omitempty"`
	// MinLength and MaxLength bound a String or Password in characters;
	// nil when the registry gives none.
	MinLength *int64 `json:"minLength,omitempty"`
	MaxLength *int64 `json:"maxLength,omitempty"`
	// ReadOnly: the BMC refuses writes (AttributeRegistry ReadOnly, or
	// Immutable).
	ReadOnly bool `json:"readOnly,omitempty"`
	// ResetRequired: a change takes effect only after a system reset
	// (AttributeRegistry ResetRequired). Most BIOS attributes are.
	ResetRequired bool `json:"resetRequired,omitempty"`
}

// BIOSRegistry is the attribute registry a BIOS publishes (Redfish
// Bios.AttributeRegistry names it; the document is under
// /redfish/v1/Registries).
type BIOSRegistry struct {
	// ID is the registry's Id, e.g. "BiosAttributeRegistry.v1_0_0" (iDRAC,
	// iLO) or "BiosAttributeRegistryR750.v1_0_0".
	ID string `json:"id"`
	// Attributes are sorted by Name.
	Attributes []BIOSAttribute `json:"attributes"`
}

// Lookup returns the attribute named name, or nil.
func (r *BIOSRegistry) Lookup(name string) *BIOSAttribute {
	if r == nil {
		return nil
	}
	i := sort.Search(len(r.Attributes), func(i int) bool { return r.Attributes[i].Name >= name })
	if i < len(r.Attributes) && r.Attributes[i].Name == name {
		return &r.Attributes[i]
	}
	return nil
}

// Sort orders the attributes by Name, as Lookup needs. Drivers call it
// after building a registry.
func (r *BIOSRegistry) Sort() {
	sort.Slice(r.Attributes, func(i, j int) bool { return r.Attributes[i].Name < r.Attributes[j].Name })
}

// BIOSSettings maps attribute names to values. A value is a string
// (Enumeration, String, Password), an int64 (Integer) or a bool (Boolean).
// CheckAttribute also accepts the other Go integer types, a float64 with no
// fraction (what JSON and YAML decoders give) and json.Number, and
// normalises them to int64.
type BIOSSettings map[string]any

// BIOS is the BIOS as the BMC reports it: current values, settings pending
// for the next reset, and the registry (peer of Metal3's
// HostFirmwareSettings status and FirmwareSchema).
type BIOS struct {
	// Attributes are the values in effect (Bios.Attributes), normalised as
	// BIOSSettings says. Password attributes read back as nil.
	Attributes BIOSSettings `json:"attributes"`
	// Pending are the settings written but not yet applied, the
	// attributes of Bios/Settings (the @Redfish.Settings object's
	// SettingsObject) whose value differs from Attributes; empty when
	// nothing is pending or the BMC has no settings object.
	Pending BIOSSettings `json:"pending,omitempty"`
	// Registry is the attribute registry; nil when the BMC publishes
	// none (the driver then cannot check a setting before sending it,
	// and the BMC's own refusal is the only check).
	Registry *BIOSRegistry `json:"registry,omitempty"`
	// SupportedApplyTimes lists the @Redfish.SettingsApplyTime values
	// the settings object accepts (SupportedApplyTimes); empty when it
	// lists none (the BMC applies at the next reset).
	SupportedApplyTimes []ApplyTime `json:"supportedApplyTimes,omitempty"`
}

// ApplyTime is when the BMC applies a settings change (Redfish
// Settings.ApplyTime enum, DSP0266 "Settings resource" and
// @Redfish.SettingsApplyTime).
type ApplyTime string

// Apply times. ApplyUnset lets the driver choose: OnReset when the BMC
// lists it in SupportedApplyTimes or lists nothing, else the first it lists.
const (
	ApplyUnset                      ApplyTime = ""
	ApplyImmediate                  ApplyTime = "Immediate"
	ApplyOnReset                    ApplyTime = "OnReset"
	ApplyAtMaintenanceWindowStart   ApplyTime = "AtMaintenanceWindowStart"
	ApplyInMaintenanceWindowOnReset ApplyTime = "InMaintenanceWindowOnReset"
)

// ApplyResult is what a settings write did: when it applies, whether the
// caller must reset the system to apply it, and the job or task to follow
// when the BMC made one.
type ApplyResult struct {
	// ApplyTime is the apply time used: the one sent as
	// @Redfish.SettingsApplyTime, or OnReset when the BMC lists no
	// SupportedApplyTimes and applies pending settings at the next reset
	// (HPE iLO 5, Lenovo XCC, Supermicro).
	ApplyTime ApplyTime `json:"applyTime"`
	// ResetRequired: the change is pending until the system resets
	// (ApplyTime OnReset, or a registry attribute with ResetRequired).
	// The driver does not reset; the caller schedules the reset.
	ResetRequired bool `json:"resetRequired"`
	// Task is the job or task the BMC made for the change, nil when none
	// (Dell iDRAC makes a configuration job, JID_..., that runs at the
	// next reset; a Redfish Task Monitor answers a 202).
	Task *Task `json:"task,omitempty"`
	// Quirks names the vendor flows the driver took, e.g.
	// "idracConfigJob" (see bmc/redfish's quirk data); empty for the
	// plain DMTF flow.
	Quirks []string `json:"quirks,omitempty"`
}

// BIOSConfigurer is an optional capability of a Driver: it reads the BIOS
// attributes and registry and writes BIOS settings (Redfish
// ComputerSystem.Bios, its @Redfish.Settings object and AttributeRegistry;
// the peer of Ironic's bios interface).
type BIOSConfigurer interface {
	// BIOS reads the current attributes, the pending settings and the
	// registry. ErrUnsupported when the system has no Bios resource.
	BIOS(ctx context.Context) (*BIOS, error)
	// SetBIOS writes settings to the settings object, applying at when
	// (ApplyUnset: see ApplyUnset). Each setting is first checked with
	// CheckAttribute against the registry (when there is one): the first
	// refusal is returned as *AttributeError and nothing is sent. A
	// refusal by the BMC (HTTP 400 with a Base MessageId such as
	// PropertyValueNotInList, PropertyUnknown, PropertyNotWritable) is
	// also an *AttributeError. The write is verified by reading the
	// settings object back (ErrMismatch names what differs). An apply
	// time the BMC does not list in SupportedApplyTimes is
	// ErrUnsupported before any write. Settings equal to the current
	// attributes with nothing pending send nothing and return
	// ApplyResult{ApplyTime: when or OnReset, ResetRequired: false}.
	SetBIOS(ctx context.Context, settings BIOSSettings, when ApplyTime) (*ApplyResult, error)
}

// AttributeRefusal says why a BIOS setting was refused.
type AttributeRefusal string

// Refusals, each with the Redfish Base MessageId a BMC answers it with.
const (
	RefuseUnknown    AttributeRefusal = "unknown"      // PropertyUnknown: no such attribute
	RefuseWrongType  AttributeRefusal = "wrong-type"   // PropertyValueTypeError
	RefuseNotInList  AttributeRefusal = "not-in-list"  // PropertyValueNotInList: an Enumeration value not allowed
	RefuseOutOfRange AttributeRefusal = "out-of-range" // PropertyValueOutOfRange, or a string length outside its bounds
	RefuseReadOnly   AttributeRefusal = "read-only"    // PropertyNotWritable
)

// AttributeError is a BIOS setting refused by the registry. It names the
// attribute, the value and what would have been allowed. Unwraps to
// ErrAttributeRefused.
type AttributeError struct {
	// Attribute is the attribute's name.
	Attribute string `json:"attribute"`
	// Value is the value refused (never a Password value: those read
	// "<redacted>").
	Value any `json:"value,omitempty"`
	// Reason is why.
	Reason AttributeRefusal `json:"reason"`
	// Type is the registry's type for the attribute; "" when unknown.
	Type AttributeType `json:"type,omitempty"`
	// Allowed lists what the registry allows: the Enumeration values, or
	// one range for an Integer ("1..100") or a String ("length 0..32"),
	// or the type ("Boolean"); empty when the attribute is unknown or
	// read-only.
	Allowed []string `json:"allowed,omitempty"`
	// Code is the BMC's MessageId when the BMC refused it
	// ("Base.1.8.PropertyValueNotInList"); "" when the driver refused
	// it from the registry before sending.
	Code string `json:"code,omitempty"`
}

func (e *AttributeError) Error() string {
	s := fmt.Sprintf("bmc: bios attribute %s", e.Attribute)
	switch e.Reason {
	case RefuseUnknown:
		s += ": unknown attribute"
	case RefuseReadOnly:
		s += ": read-only"
	case RefuseWrongType:
		s += fmt.Sprintf(": value %s is not of type %s", showValue(e.Value), e.Type)
	case RefuseNotInList:
		s += fmt.Sprintf(": value %s not allowed", showValue(e.Value))
	case RefuseOutOfRange:
		s += fmt.Sprintf(": value %s out of range", showValue(e.Value))
	default:
		s += ": refused"
	}
	if len(e.Allowed) > 0 {
		s += " (allowed: " + strings.Join(e.Allowed, ", ") + ")"
	}
	if e.Code != "" {
		s += " [" + e.Code + "]"
	}
	return s
}

// Unwrap returns ErrAttributeRefused.
func (e *AttributeError) Unwrap() error { return ErrAttributeRefused }

func showValue(v any) string {
	if s, ok := v.(string); ok {
		return strconv.Quote(s)
	}
	return fmt.Sprint(v)
}

// Allowed describes what a registry attribute accepts, as AttributeError
// lists it.
func (a *BIOSAttribute) Allowed() []string {
	switch a.Type {
	case AttrEnumeration:
		return append([]string(nil), a.AllowedValues...)
	case AttrInteger:
		if a.LowerBound == nil && a.UpperBound == nil {
			return []string{"Integer"}
		}
		lo, hi := "", ""
		if a.LowerBound != nil {
			lo = strconv.FormatInt(*a.LowerBound, 10)
		}
		if a.UpperBound != nil {
			hi = strconv.FormatInt(*a.UpperBound, 10)
		}
		return []string{lo + ".." + hi}
	case AttrString, AttrPassword:
		if a.MinLength == nil && a.MaxLength == nil {
			return []string{string(a.Type)}
		}
		lo, hi := "0", ""
		if a.MinLength != nil {
			lo = strconv.FormatInt(*a.MinLength, 10)
		}
		if a.MaxLength != nil {
			hi = strconv.FormatInt(*a.MaxLength, 10)
		}
		return []string{"length " + lo + ".." + hi}
	case AttrBoolean:
		return []string{"true", "false"}
	}
	return nil
}

// CheckAttribute checks value for the attribute name against reg and
// returns it normalised (int64 for Integer). A nil registry accepts
// anything (normalising numbers). The error is *AttributeError. Enumeration
// values match ValueName exactly (BMCs compare case-sensitively).
func CheckAttribute(reg *BIOSRegistry, name string, value any) (any, error) {
	v := NormalizeValue(value)
	if reg == nil {
		return v, nil
	}
	a := reg.Lookup(name)
	if a == nil {
		return nil, &AttributeError{Attribute: name, Value: v, Reason: RefuseUnknown}
	}
	shown := v
	if a.Type == AttrPassword {
		shown = "<redacted>"
	}
	refuse := func(r AttributeRefusal) error {
		e := &AttributeError{Attribute: name, Value: shown, Reason: r, Type: a.Type}
		if r != RefuseReadOnly {
			e.Allowed = a.Allowed()
		}
		return e
	}
	if a.ReadOnly {
		return nil, refuse(RefuseReadOnly)
	}
	switch a.Type {
	case AttrEnumeration:
		s, ok := v.(string)
		if !ok {
			return nil, refuse(RefuseWrongType)
		}
		for _, x := range a.AllowedValues {
			if x == s {
				return s, nil
			}
		}
		return nil, refuse(RefuseNotInList)
	case AttrString, AttrPassword:
		s, ok := v.(string)
		if !ok {
			return nil, refuse(RefuseWrongType)
		}
		n := int64(len([]rune(s)))
		if (a.MinLength != nil && n < *a.MinLength) || (a.MaxLength != nil && n > *a.MaxLength) {
			return nil, refuse(RefuseOutOfRange)
		}
		return s, nil
	case AttrInteger:
		n, ok := v.(int64)
		if !ok {
			return nil, refuse(RefuseWrongType)
		}
		if (a.LowerBound != nil && n < *a.LowerBound) || (a.UpperBound != nil && n > *a.UpperBound) {
			return nil, refuse(RefuseOutOfRange)
		}
		return n, nil
	case AttrBoolean:
		b, ok := v.(bool)
		if !ok {
			return nil, refuse(RefuseWrongType)
		}
		return b, nil
	}
	// A type this contract does not know: let the BMC judge.
	return v, nil
}

// CheckSettings checks every setting with CheckAttribute, in name order,
// and returns them normalised, or all refusals joined (errors.Join of
// *AttributeError, so errors.As finds the first).
func CheckSettings(reg *BIOSRegistry, s BIOSSettings) (BIOSSettings, error) {
	names := make([]string, 0, len(s))
	for k := range s {
		names = append(names, k)
	}
	sort.Strings(names)
	out := make(BIOSSettings, len(s))
	var errs []error
	for _, k := range names {
		v, err := CheckAttribute(reg, k, s[k])
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out[k] = v
	}
	return out, errors.Join(errs...)
}

// NormalizeValue returns v with Go integer types, integral float64 and
// float32, and json.Number holding an integer turned into int64; other
// values unchanged.
func NormalizeValue(v any) any {
	switch x := v.(type) {
	case int:
		return int64(x)
	case int8:
		return int64(x)
	case int16:
		return int64(x)
	case int32:
		return int64(x)
	case uint8:
		return int64(x)
	case uint16:
		return int64(x)
	case uint32:
		return int64(x)
	case uint:
		if uint64(x) <= math.MaxInt64 {
			return int64(x)
		}
	case uint64:
		if x <= math.MaxInt64 {
			return int64(x)
		}
	case float64:
		if x == math.Trunc(x) && math.Abs(x) < 1<<53 {
			return int64(x)
		}
	case float32:
		if f := float64(x); f == math.Trunc(f) && math.Abs(f) < 1<<24 {
			return int64(f)
		}
	case json.Number:
		if n, err := x.Int64(); err == nil {
			return n
		}
	}
	return v
}

// SameValue reports whether two attribute values are equal after
// NormalizeValue.
func SameValue(a, b any) bool {
	return NormalizeValue(a) == NormalizeValue(b)
}

// RAID types (Redfish Volume.RAIDType, DSP0268 Volume v1.3+).
const (
	RAID0  = "RAID0"
	RAID1  = "RAID1"
	RAID5  = "RAID5"
	RAID6  = "RAID6"
	RAID10 = "RAID10"
	RAID50 = "RAID50"
	RAID60 = "RAID60"
)

// StorageController is one Redfish Storage resource (a RAID controller, an
// HBA, the NVMe subsystem) with its drives and volumes.
type StorageController struct {
	// ID is the Storage resource's Id ("RAID.Integrated.1-1" on iDRAC,
	// "DE00A000" on iLO, "RAID_Slot1" on XCC, "1" on bmcweb).
	ID   string `json:"id"`
	Name string `json:"name,omitempty"`
	// Model is the first StorageControllers[].Model (or Controllers'),
	// "" when none.
	Model string `json:"model,omitempty"`
	// RAIDTypes are the RAID types the controller can create
	// (StorageControllers[].SupportedRAIDTypes); empty when it reports
	// none (an HBA, or a BMC that does not say).
	RAIDTypes []string `json:"raidTypes,omitempty"`
	// CanCreateVolumes: the Volumes collection accepts POST (it is
	// listed and the BMC does not forbid it); false for HBAs and BMCs
	// without RAID management.
	CanCreateVolumes bool     `json:"canCreateVolumes"`
	Drives           []Drive  `json:"drives,omitempty"`
	Volumes          []Volume `json:"volumes,omitempty"`
}

// Drive is one physical drive (Redfish Drive).
type Drive struct {
	// ID is the Drive's Id; Volume requests name drives by it.
	ID            string `json:"id"`
	Name          string `json:"name,omitempty"`
	Model         string `json:"model,omitempty"`
	Serial        string `json:"serial,omitempty"`
	CapacityBytes int64  `json:"capacityBytes,omitempty"`
	// MediaType is "HDD", "SSD" or "" when unknown.
	MediaType string `json:"mediaType,omitempty"`
	// Protocol is "SAS", "SATA", "NVMe" or "".
	Protocol string `json:"protocol,omitempty"`
	// Health is Status.Health, "" when not reported.
	Health string `json:"health,omitempty"`
}

// Volume is one logical drive (Redfish Volume).
type Volume struct {
	ID   string `json:"id"`
	Name string `json:"name,omitempty"`
	// RAIDType is Volume.RAIDType, or mapped from the older VolumeType
	// (NonRedundant RAID0, Mirrored RAID1, StripedWithParity RAID5,
	// SpannedMirrors RAID10); "" when the BMC reports neither.
	RAIDType      string `json:"raidType,omitempty"`
	CapacityBytes int64  `json:"capacityBytes,omitempty"`
	// Drives are the Ids of the drives in Links.Drives.
	Drives []string `json:"drives,omitempty"`
	Health string   `json:"health,omitempty"`
}

// VolumeRequest asks for a new volume on one controller (the peer of
// Ironic's target_raid_config logical disk).
type VolumeRequest struct {
	// Controller is the StorageController ID.
	Controller string `json:"controller"`
	// Name is the volume's Name; "" lets the BMC name it.
	Name string `json:"name,omitempty"`
	// RAIDType is one of the RAID constants.
	RAIDType string `json:"raidType"`
	// Drives are Drive IDs on the controller (at least one).
	Drives []string `json:"drives"`
	// CapacityBytes is the size; 0 uses all the drives' space.
	CapacityBytes int64 `json:"capacityBytes,omitempty"`
	// ApplyTime is @Redfish.OperationApplyTime; ApplyUnset sends none
	// (Dell iDRAC then defaults to a job at the next reset).
	ApplyTime ApplyTime `json:"applyTime,omitempty"`
}

// RAIDConfigurer is an optional capability of a Driver: it lists storage
// controllers, drives and volumes, and creates and deletes volumes
// (Redfish Storage, Drive, Volume; the peer of Ironic's raid interface).
type RAIDConfigurer interface {
	// Storage lists the system's storage controllers with their drives
	// and volumes. ErrUnsupported when the system has no Storage.
	Storage(ctx context.Context) ([]StorageController, error)
	// CreateVolume POSTs a Volume to the controller's Volumes. Bad input
	// (unknown controller or drive, RAID type not in RAIDTypes, no drive)
	// is refused before sending with an error naming the field. The
	// result says whether the volume exists now (ResetRequired false, a
	// Task to follow perhaps) or at the next reset (Dell PERC jobs).
	CreateVolume(ctx context.Context, r VolumeRequest) (*ApplyResult, error)
	// DeleteVolume DELETEs the volume on the controller. A volume that
	// does not exist is an error naming it.
	DeleteVolume(ctx context.Context, controller, volume string) (*ApplyResult, error)
}

// FirmwareComponent is one item of the firmware inventory (Redfish
// UpdateService.FirmwareInventory SoftwareInventory; the peer of Metal3's
// HostFirmwareComponents).
type FirmwareComponent struct {
	// ID is the SoftwareInventory Id, the update target.
	ID      string `json:"id"`
	Name    string `json:"name,omitempty"`
	Version string `json:"version,omitempty"`
	// Updateable: the BMC can update it (SoftwareInventory.Updateable).
	Updateable bool `json:"updateable"`
	// URI is the resource's @odata.id, what Targets names.
	URI string `json:"uri,omitempty"`
}

// FirmwareUpdate asks for one firmware image to be applied. Exactly one of
// ImageURI and Image is set.
type FirmwareUpdate struct {
	// ImageURI is where the BMC fetches the image
	// (UpdateService.SimpleUpdate ImageURI); it must be reachable from
	// the BMC's network.
	ImageURI string `json:"imageURI,omitempty"`
	// TransferProtocol is SimpleUpdate's TransferProtocol, "HTTP" when ""
	// (HTTPS for an https URI).
	TransferProtocol string `json:"transferProtocol,omitempty"`
	// Image is the image pushed to UpdateService.MultipartHttpPushUri
	// (DSP0266 "Multipart HTTP push updates"); the driver reads it once.
	Image io.Reader `json:"-"`
	// ImageName is the file name sent with Image, e.g. "BIOS_1.2.3.bin".
	ImageName string `json:"imageName,omitempty"`
	// Targets are FirmwareComponent URIs to update; empty lets the BMC
	// choose from the image.
	Targets []string `json:"targets,omitempty"`
	// ApplyTime is @Redfish.OperationApplyTime: in SimpleUpdate's body
	// (only when the action's OperationApplyTimeSupport lists it, else
	// ErrUnsupported before anything is sent) or in the multipart
	// UpdateParameters. ApplyUnset sends none (the BMC's default,
	// usually Immediate). With ApplyOnReset the task waits for the next
	// host reset (Pending) and runs then.
	ApplyTime ApplyTime `json:"applyTime,omitempty"`
}

// FirmwareUpdater is an optional capability of a Driver: it reads the
// firmware inventory and starts updates it then follows as tasks (Redfish
// UpdateService, TaskService; the peer of Ironic's firmware interface).
type FirmwareUpdater interface {
	// FirmwareInventory lists UpdateService.FirmwareInventory.
	// ErrUnsupported when the BMC has no UpdateService.
	FirmwareInventory(ctx context.Context) ([]FirmwareComponent, error)
	// UpdateFirmware starts u and returns the task the BMC made for it
	// (from the 202's Location or the body's @odata.id). ErrUnsupported
	// when the BMC lacks the way asked for (no SimpleUpdate action, no
	// MultipartHttpPushUri) or the TransferProtocol is not among the
	// allowed values.
	UpdateFirmware(ctx context.Context, u FirmwareUpdate) (*Task, error)
	TaskFollower
}

// TaskFollower reads a task or job by its URI. BMCs restart during
// firmware updates: while they do, Task answers an error for which
// IsTransient is true, and WaitTask keeps polling.
type TaskFollower interface {
	// Task reads the task at uri (a Task, a Task Monitor or a Dell Job).
	Task(ctx context.Context, uri string) (*Task, error)
}

// TaskState is Redfish Task.TaskState (DSP0268 Task); Dell Job JobState
// values are mapped onto it by the driver (Scheduled and New to Pending,
// Running to Running, Completed to Completed, Failed to Exception,
// CompletedWithErrors to Exception).
type TaskState string

// Task states. Completed, Exception, Killed and Cancelled end a task.
const (
	TaskNew         TaskState = "New"
	TaskStarting    TaskState = "Starting"
	TaskRunning     TaskState = "Running"
	TaskSuspended   TaskState = "Suspended"
	TaskInterrupted TaskState = "Interrupted"
	TaskPending     TaskState = "Pending"
	TaskStopping    TaskState = "Stopping"
	TaskCompleted   TaskState = "Completed"
	TaskKilled      TaskState = "Killed"
	TaskException   TaskState = "Exception"
	TaskService     TaskState = "Service"
	TaskCancelling  TaskState = "Cancelling"
	TaskCancelled   TaskState = "Cancelled"
)

// Done reports whether s ends a task.
func (s TaskState) Done() bool {
	switch s {
	case TaskCompleted, TaskException, TaskKilled, TaskCancelled:
		return true
	}
	return false
}

// Task is a BMC task or job as last read.
type Task struct {
	// URI is what Task reads: the Task's @odata.id, or its Task Monitor
	// when the BMC gave only that.
	URI string `json:"uri"`
	// ID is the Task's Id ("JID_123456789012" for a Dell job).
	ID    string    `json:"id,omitempty"`
	State TaskState `json:"state"`
	// Status is TaskStatus ("OK", "Warning", "Critical"), "" when none.
	Status string `json:"status,omitempty"`
	// PercentComplete is 0..100; nil when the BMC does not say.
	PercentComplete *int `json:"percentComplete,omitempty"`
	// Messages are the task's Messages, oldest first.
	Messages []TaskMessage `json:"messages,omitempty"`
}

// TaskMessage is one Redfish Message of a task.
type TaskMessage struct {
	MessageID string `json:"messageId,omitempty"`
	Message   string `json:"message,omitempty"`
	Severity  string `json:"severity,omitempty"`
}

// Failed reports whether the task ended without success: Exception, Killed
// or Cancelled, or Completed with TaskStatus Critical.
func (t *Task) Failed() bool {
	switch t.State {
	case TaskException, TaskKilled, TaskCancelled:
		return true
	case TaskCompleted:
		return t.Status == "Critical"
	}
	return false
}

// TaskError is a task that ended without success. Unwraps to ErrTaskFailed.
type TaskError struct {
	Task *Task
}

func (e *TaskError) Error() string {
	s := fmt.Sprintf("bmc: task %s ended %s", e.Task.URI, e.Task.State)
	if e.Task.Status != "" {
		s += " (" + e.Task.Status + ")"
	}
	for _, m := range e.Task.Messages {
		if m.Message != "" || m.MessageID != "" {
			s += ": " + strings.TrimSpace(m.MessageID+" "+m.Message)
		}
	}
	return s
}

// Unwrap returns ErrTaskFailed.
func (e *TaskError) Unwrap() error { return ErrTaskFailed }

// ErrTaskFailed: a BMC task or job ended in Exception, Killed, Cancelled or
// Completed with Critical status; see *TaskError.
var ErrTaskFailed = errors.New("bmc: task failed")

// WaitTask polls f for the task at uri every interval until it ends or
// ctx is done. Transient errors (the BMC restarting after a firmware
// update: refused connections, 503) are retried until ctx ends; other
// errors end the wait. progress, when not nil, is called with each read.
// A task that ends without success returns it with a *TaskError. A ctx
// that ends first returns the last read and ctx's error wrapped with
// ErrTimeout.
func WaitTask(ctx context.Context, f TaskFollower, uri string, interval time.Duration, progress func(*Task)) (*Task, error) {
	if interval <= 0 {
		interval = time.Second
	}
	var last *Task
	var lastErr error
	for {
		t, err := f.Task(ctx, uri)
		switch {
		case err == nil:
			last, lastErr = t, nil
			if progress != nil {
				progress(t)
			}
			if t.State.Done() {
				if t.Failed() {
					return t, &TaskError{Task: t}
				}
				return t, nil
			}
		case IsTransient(err) && ctx.Err() == nil:
			lastErr = err
		default:
			return last, fmt.Errorf("bmc: follow task %s: %w", uri, err)
		}
		tm := time.NewTimer(interval)
		select {
		case <-ctx.Done():
			tm.Stop()
			if lastErr != nil {
				return last, fmt.Errorf("bmc: follow task %s: %w (%w; last error: %v)", uri, ErrTimeout, ctx.Err(), lastErr)
			}
			return last, fmt.Errorf("bmc: follow task %s: %w (%w)", uri, ErrTimeout, ctx.Err())
		case <-tm.C:
		}
	}
}

// SecureBootMode is SecureBoot.SecureBootMode (UEFI 2.x §32.3 modes).
type SecureBootMode string

// Secure Boot modes.
const (
	SecureBootSetupMode    SecureBootMode = "SetupMode"
	SecureBootUserMode     SecureBootMode = "UserMode"
	SecureBootAuditMode    SecureBootMode = "AuditMode"
	SecureBootDeployedMode SecureBootMode = "DeployedMode"
)

// SecureBoot is the system's UEFI Secure Boot state (Redfish SecureBoot).
type SecureBoot struct {
	// Enable is SecureBootEnable: what is configured, applying at the
	// next reset.
	Enable bool `json:"enable"`
	// CurrentBoot is SecureBootCurrentBoot, the state of the running
	// boot: "Enabled", "Disabled", or "" when not reported.
	CurrentBoot string `json:"currentBoot,omitempty"`
	// Mode is SecureBootMode, "" when not reported.
	Mode SecureBootMode `json:"mode,omitempty"`
}

// SecureBootConfigurer is an optional capability of a Driver: it reads and
// sets UEFI Secure Boot (Redfish ComputerSystem.SecureBoot).
type SecureBootConfigurer interface {
	// SecureBoot reads the state. ErrUnsupported when the system has no
	// SecureBoot resource.
	SecureBoot(ctx context.Context) (*SecureBoot, error)
	// SetSecureBoot PATCHes SecureBootEnable and reads it back. The
	// change applies at the next reset on every BMC seen (iDRAC, iLO,
	// XCC, bmcweb): ResetRequired is true when CurrentBoot differs from
	// the wanted state. Setting the state already configured sends
	// nothing.
	SetSecureBoot(ctx context.Context, enable bool) (*ApplyResult, error)
}
