// Package bmc defines the contract every BMC driver implements: power, boot
// override, virtual media and a read model, with typed errors the reconciler
// sorts into transient, unsupported and needs-a-human.
//
// bmc is a leaf: it imports no other Machina package. Protocol drivers live in
// bmc/redfish (DMTF Redfish, DSP0266) and bmc/ipmi (IPMI v2.0 over RMCP+);
// bmc/bmcsim is an emulator used by tests and the simulated lab.
package bmc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
)

// PowerState is the chassis power as the BMC reports it.
type PowerState string

// Power states. PowerUnknown is returned when the BMC reports something
// outside the Redfish PowerState enum (Resource.PowerState) or IPMI chassis
// status byte 1 bit 0 cannot be read.
const (
	PowerOn      PowerState = "on"
	PowerOff     PowerState = "off"
	PowerUnknown PowerState = "unknown"
)

// PowerAction is an operator-level power request, mapped by each driver to
// the protocol's own vocabulary (Redfish ResetType, IPMI chassis control).
type PowerAction string

// Power actions. All are idempotent at the driver level: PowerActionOn on a
// running machine and PowerActionOff on a stopped one send nothing;
// PowerActionReset and PowerActionCycle on a stopped machine power it on.
const (
	PowerActionOn      PowerAction = "on"       // Redfish On/ForceOn; IPMI chassis control 01h
	PowerActionOff     PowerAction = "off"      // hard off: Redfish ForceOff; IPMI chassis control 00h
	PowerActionSoftOff PowerAction = "soft-off" // Redfish GracefulShutdown, bounded wait, then ForceOff; IPMI 05h
	PowerActionReset   PowerAction = "reset"    // warm reset: Redfish ForceRestart; IPMI chassis control 03h
	PowerActionCycle   PowerAction = "cycle"    // off then on: Redfish PowerCycle; IPMI chassis control 02h
)

// ParsePowerAction returns the PowerAction named s, or an error naming s.
func ParsePowerAction(s string) (PowerAction, error) {
	switch a := PowerAction(s); a {
	case PowerActionOn, PowerActionOff, PowerActionSoftOff, PowerActionReset, PowerActionCycle:
		return a, nil
	}
	return "", fmt.Errorf("bmc: unknown power action %q (want on, off, soft-off, reset or cycle)", s)
}

// BootDevice is a boot override target.
type BootDevice string

// Boot devices, mapped to Redfish BootSourceOverrideTarget (Pxe, Hdd, Cd,
// BiosSetup) and IPMI boot-option parameter 5 data byte 2 device selectors
// (04h PXE, 08h disk, 14h CD/DVD, 18h BIOS setup).
const (
	BootPXE       BootDevice = "pxe"
	BootDisk      BootDevice = "disk"
	BootCD        BootDevice = "cd"
	BootBIOSSetup BootDevice = "bios-setup"
)

// ParseBootDevice returns the BootDevice named s, or an error naming s.
func ParseBootDevice(s string) (BootDevice, error) {
	switch d := BootDevice(s); d {
	case BootPXE, BootDisk, BootCD, BootBIOSSetup:
		return d, nil
	}
	return "", fmt.Errorf("bmc: unknown boot device %q (want pxe, disk, cd or bios-setup)", s)
}

// BootMode is the firmware interface the override applies to.
type BootMode string

// Boot modes. BootModeUnset leaves the BMC's current mode alone.
const (
	BootModeUnset  BootMode = ""
	BootModeUEFI   BootMode = "uefi"
	BootModeLegacy BootMode = "bios"
)

// BootOverride is a request to boot from Device next time (Persistent false,
// Redfish BootSourceOverrideEnabled=Once) or every time (Continuous).
type BootOverride struct {
	Device     BootDevice
	Persistent bool
	// Mode is the firmware mode; BootModeUnset keeps what the BMC has.
	Mode BootMode
}

// Driver is one BMC. Implementations MUST be safe for concurrent use by one
// caller at a time per BMC (the reconciler serialises actions per server) and
// MUST verify every write by reading it back: a BMC that acknowledges a change
// it did not make yields an error that names the wanted and the read value.
//
// Every method bounds its own I/O with the context and the driver's timeouts.
// Errors wrap one of the sentinels below, or are *BMCError.
type Driver interface {
	// PowerState reads the current chassis power.
	PowerState(ctx context.Context) (PowerState, error)
	// Power performs a, idempotently, and polls until the BMC reports the
	// expected state or the driver's power timeout passes (ErrTimeout).
	Power(ctx context.Context, a PowerAction) error
	// SetBootOverride sets the next (or every) boot device and reads it back.
	// A BMC with no boot-override support returns ErrUnsupported before any
	// write is sent.
	SetBootOverride(ctx context.Context, o BootOverride) error
	// BootOverride reads the current override; Device is "" when none is set.
	BootOverride(ctx context.Context) (BootOverride, error)
	// InsertMedia mounts the image at url as a virtual CD, ejecting what is
	// inserted first. ErrUnsupported when the BMC has no virtual CD.
	InsertMedia(ctx context.Context, url string) error
	// EjectMedia unmounts the virtual CD; nil when nothing is inserted.
	EjectMedia(ctx context.Context) error
	// Info returns the read model. Sections the BMC does not report are
	// listed in Info.Missing rather than returned as errors.
	Info(ctx context.Context) (*Info, error)
	// Close releases sessions held on the BMC (Redfish sessions exhaust a
	// small table on iDRAC if leaked). Safe to call more than once.
	Close(ctx context.Context) error
}

// HealthReader is an optional capability of a Driver that can read the
// system's power state and health rollup in one cheap exchange (Redfish:
// one GET of the ComputerSystem, its PowerState and Status.HealthRollup or
// Status.Health, Redfish DSP0268 ComputerSystem and Resource.Status).
// Periodic BMC sweeps use it instead of Info, which reads a dozen resources.
// Health is "OK", "Warning", "Critical" or "" when the BMC reports none.
type HealthReader interface {
	Health(ctx context.Context) (power PowerState, health string, err error)
}

// SecurityReporter is an optional capability of a Driver whose sessions
// negotiate their protection: it names what the last session runs with,
// as the BMC answered (IPMI: the cipher suite and the authentication,
// integrity and confidentiality algorithms of the RMCP+ Open Session
// Response, IPMI v2.0 §13.17, e.g. "cipher suite 3 (RAKP-HMAC-SHA1,
// HMAC-SHA1-96, AES-CBC-128)"); "" before the first session.
type SecurityReporter interface {
	SessionSecurity() string
}

// Console is an optional capability of a Driver whose BMC offers a serial
// console (IPMI Serial-over-LAN, IPMI v2.0 §15). Callers type-assert a
// Driver to Console; a Driver without it has no console, and callers answer
// ErrUnsupported ("not supported by this BMC").
type Console interface {
	// OpenConsole attaches to the system's serial console. Reads return the
	// system's serial output, writes are typed on its serial input, Close
	// detaches and releases the BMC's console session (it MUST be called,
	// and MAY be called more than once). Errors wrap the sentinels above.
	OpenConsole(ctx context.Context) (io.ReadWriteCloser, error)
}

// Info is the read model of one BMC and its system.
type Info struct {
	Manufacturer string `json:"manufacturer,omitempty"`
	Model        string `json:"model,omitempty"`
	Serial       string `json:"serial,omitempty"`
	UUID         string `json:"uuid,omitempty"`
	BIOSVersion  string `json:"biosVersion,omitempty"`
	BMCFirmware  string `json:"bmcFirmware,omitempty"`
	// NICMACs are the system's NIC MAC addresses, lower-case colon form,
	// candidates for the boot MAC.
	NICMACs []string `json:"nicMACs,omitempty"`
	// Health is the rollup: "OK", "Warning", "Critical" or "" when unknown.
	Health       string        `json:"health,omitempty"`
	Power        PowerState    `json:"power,omitempty"`
	Temperatures []Temperature `json:"temperatures,omitempty"`
	// PowerWatts is the consumed power; nil when the BMC does not report it.
	PowerWatts *float64        `json:"powerWatts,omitempty"`
	Firmware   []FirmwareEntry `json:"firmware,omitempty"`
	Logs       []LogEntry      `json:"logs,omitempty"`
	// Missing names the sections the BMC did not report: "identity",
	// "health", "temperatures", "power", "firmware", "logs", "nics",
	// "uuid", "biosVersion".
	Missing []string `json:"missing,omitempty"`
	// Untied lists the readings left out because they could not be tied
	// to this system (a sensor of another system in a shared chassis),
	// one line each, e.g. `temperature "CPU Temp" (/redfish/...): tied to
	// another system`.
	Untied []string `json:"untied,omitempty"`
}

// Temperature is one sensor reading.
type Temperature struct {
	Name    string  `json:"name"`
	Celsius float64 `json:"celsius"`
	Health  string  `json:"health,omitempty"`
}

// FirmwareEntry is one firmware inventory item.
type FirmwareEntry struct {
	Name    string `json:"name"`
	Version string `json:"version"`
}

// LogEntry is one BMC log entry (Redfish LogEntry, IPMI SEL).
type LogEntry struct {
	Created  time.Time `json:"created"`
	Severity string    `json:"severity,omitempty"`
	Message  string    `json:"message"`
}

// OnceOutcome is what a BMC did with a one-time boot override
// (BootOverride.Persistent false).
type OnceOutcome string

// One-time override outcomes. Real BMCs do all three: Supermicro and some
// Lenovo XCC releases read back Continuous for Once; older iDRAC and AMI
// firmware accept the PATCH and keep the old override; some list no Once in
// BootSourceOverrideEnabled@Redfish.AllowableValues at all.
const (
	OnceHonoured    OnceOutcome = "honoured"              // read back Once
	OnceCoerced     OnceOutcome = "coerced-to-continuous" // read back Continuous: a persistent override is now set
	OnceIgnored     OnceOutcome = "ignored"               // accepted, but the override read back is not the one asked for
	OnceUnsupported OnceOutcome = "unsupported"           // the BMC lists no Once; nothing was sent
)

// OnceError is returned by SetBootOverride when a one-time override was
// asked for and the BMC did not honour it. Got is what the BMC is set to
// now, read back (Device "" when no override is set). Callers that can
// compensate (set the device persistently and set disk back after the
// boot) check it with errors.As; others fail on it. Unwraps to
// ErrOnceNotHonoured.
type OnceError struct {
	Want    BootOverride
	Got     BootOverride
	Outcome OnceOutcome
}

func (e *OnceError) Error() string {
	got := "no override"
	if e.Got.Device != "" {
		got = string(e.Got.Device)
		if e.Got.Persistent {
			got += " persistent (every boot)"
		} else {
			got += " once"
		}
	}
	return fmt.Sprintf("bmc: one-time boot override %s not honoured (%s): the BMC is now set to %s", e.Want.Device, e.Outcome, got)
}

// Unwrap returns ErrOnceNotHonoured.
func (e *OnceError) Unwrap() error { return ErrOnceNotHonoured }

// BootQuirk names one way a BMC departs from a boot override it accepted,
// learned by reading the override back. The names are the ones status
// shows (bmcQuirks).
type BootQuirk string

// Boot override quirks.
const (
	// QuirkBootFlagsNotPersistent: asked for a persistent override, the
	// BMC reads back a one-time one. IPMI BMCs that keep only the device
	// selector of boot-option parameter 5 do this (pyghmi's Bmc class and
	// so VirtualBMC read back flags 0x80 whatever was written; so do some
	// AMI MegaRAC and Supermicro X9/X10 firmware): whether the device
	// stays for later boots is the BMC's business (VirtualBMC keeps it for
	// every boot, a spec-following BMC clears it after the next boot or
	// 60 s), so a one-time override on such a BMC is not verifiable either.
	QuirkBootFlagsNotPersistent BootQuirk = "bootFlagsNotPersistent"
	// QuirkBootModeIgnored: asked for a firmware mode (UEFI or legacy),
	// the BMC reads back the other one (IPMI boot flags byte 1 bit 5
	// cleared; the same BMCs as above). The firmware boots in the mode it
	// is configured for.
	QuirkBootModeIgnored BootQuirk = "bootModeIgnored"
	// QuirkBootDeviceAtPowerOn: while the system runs, the BMC reads back
	// the device it booted with, not the one just set; the new device
	// applies at the next power-on from off and not at a reset.
	// VirtualBMC over libvirt does this (it defines the inactive domain
	// and reads the running one); so do BMCs whose boot order is a BIOS
	// setting read at power-on. Power off, read back, then power on.
	QuirkBootDeviceAtPowerOn BootQuirk = "bootDeviceAtPowerOn"
)

// KeptError is returned by SetBootOverride when the BMC accepted an
// override and kept only part of it. Got is what it reads back; Quirks
// says what was not kept (at least one). Callers that can reach their goal
// anyway (a deployed server that boots its disk through the firmware's
// boot order or a local-boot iPXE script; a power-off before the power-on
// that applies the device) check it with errors.As; others fail on it.
// Unwraps to ErrPartlyKept.
type KeptError struct {
	Want   BootOverride
	Got    BootOverride
	Quirks []BootQuirk
}

func (e *KeptError) Error() string {
	got := "no override"
	if e.Got.Device != "" {
		got = string(e.Got.Device)
		if e.Got.Persistent {
			got += " persistent"
		} else {
			got += " once"
		}
		if e.Got.Mode != BootModeUnset {
			got += " " + string(e.Got.Mode)
		}
	}
	want := string(e.Want.Device)
	if e.Want.Persistent {
		want += " persistent"
	} else {
		want += " once"
	}
	if e.Want.Mode != BootModeUnset {
		want += " " + string(e.Want.Mode)
	}
	qs := make([]string, len(e.Quirks))
	for i, q := range e.Quirks {
		qs[i] = string(q)
	}
	return fmt.Sprintf("bmc: boot override %s kept only in part (%s): the BMC reads back %s", want, strings.Join(qs, ", "), got)
}

// Unwrap returns ErrPartlyKept.
func (e *KeptError) Unwrap() error { return ErrPartlyKept }

// Has reports whether q is among e.Quirks.
func (e *KeptError) Has(q BootQuirk) bool {
	for _, x := range e.Quirks {
		if x == q {
			return true
		}
	}
	return false
}

// ResetError is returned by Power for PowerActionReset and PowerActionCycle
// when the BMC accepted the reset but showed no evidence that it happened
// (no power-off observed, LastResetTime and BootProgress unchanged or
// absent, no task, no IPMI chassis status change). The machine is on;
// whether it restarted is unknown. Unwraps to ErrUnverified.
type ResetError struct {
	Action PowerAction
	// Why lists what was looked at, e.g. "a reset keeps the machine on by
	// design, so its power state cannot show it; ... no power-off was
	// seen". A reset is not verified by the power state it ends in (on
	// before and after), unlike on and off.
	Why string
}

func (e *ResetError) Error() string {
	return fmt.Sprintf("bmc: %s accepted but not verified: %s", e.Action, e.Why)
}

// Unwrap returns ErrUnverified.
func (e *ResetError) Unwrap() error { return ErrUnverified }

// ResetEvidence is an optional capability of a Driver: it reports what
// proved the last successful PowerActionReset or PowerActionCycle
// ("power-off observed", "LastResetTime changed", "BootProgress moved",
// "task completed", "IPMI chassis status: off then on"), "" when none.
type ResetEvidence interface {
	LastResetEvidence() string
}

// ResetClock is an optional capability of a Driver whose BMC stamps the
// system's last reset: Redfish ComputerSystem.LastResetTime (DSP0268,
// ComputerSystem v1.12; Dell iDRAC 9 and OpenBMC bmcweb report it, HPE
// iLO 5, Lenovo XCC and Supermicro X13 do not). IPMI has no such stamp
// (chassis status, IPMI v2.0 §28.2, gives power and the cause of the last
// power event, no time), so bmc/ipmi does not implement it.
//
// A caller that journals a reset reads the stamp before the reset goes out
// and again when it resumes the entry after a crash or a failover: a
// changed stamp means the BMC reset the system in between, so the reset is
// not sent again. The stamp is in the BMC's clock; compare it with another
// stamp of the same BMC rather than with the controller's clock.
type ResetClock interface {
	// LastReset reads the power state and the last reset time in one
	// exchange. ok is false (and last zero) when the BMC reports no
	// LastResetTime or one that does not parse as RFC 3339.
	LastReset(ctx context.Context) (power PowerState, last time.Time, ok bool, err error)
}

// Sentinel errors. Drivers wrap them; callers use errors.Is.
var (
	// ErrAuth: the BMC refused the credentials (HTTP 401/403 on login,
	// IPMI RAKP failure). Not retried: it needs a human.
	ErrAuth = errors.New("bmc: authentication failed")
	// ErrUnreachable: no answer (connection refused, DNS, no route, UDP
	// silence). Transient.
	ErrUnreachable = errors.New("bmc: unreachable")
	// ErrUnsupported: the BMC lacks the feature (no boot override, no
	// virtual media, no allowed ResetType for the action).
	ErrUnsupported = errors.New("bmc: not supported by this BMC")
	// ErrTransient: the BMC is busy (503, 502, IPMI 0xC0 node busy);
	// retry with backoff.
	ErrTransient = errors.New("bmc: transient failure")
	// ErrTimeout: the BMC accepted a command but never reached the state.
	ErrTimeout = errors.New("bmc: timed out waiting for state")
	// ErrRefused: the BMC refused the request in its present state (IPMI
	// completion code 0xD5).
	ErrRefused = errors.New("bmc: refused in present state")
	// ErrMismatch: a write was acknowledged but reading back shows another
	// value. The error text names both.
	ErrMismatch = errors.New("bmc: read back does not match")
	// ErrOnceNotHonoured: a one-time boot override was not honoured; see
	// *OnceError for what the BMC is set to now.
	ErrOnceNotHonoured = errors.New("bmc: one-time boot override not honoured")
	// ErrPartlyKept: a boot override was accepted and kept only in part;
	// see *KeptError for what the BMC reads back and which quirks it has.
	ErrPartlyKept = errors.New("bmc: boot override kept only in part")
	// ErrUnverified: a reset or cycle was accepted but nothing proved it
	// happened; see *ResetError.
	ErrUnverified = errors.New("bmc: reset not verified")
)

// BMCError is an error the BMC reported in its own words: the Redfish error
// body's MessageId and Message (DSP0266 §9.6 error responses), or an IPMI
// completion code.
type BMCError struct {
	// BMC names the BMC (its Redfish endpoint or IPMI address), "" when
	// the driver does not know it.
	BMC string
	// Op names the operation, e.g. "set boot override".
	Op string
	// Request is the request the BMC answered, e.g.
	// "PATCH /redfish/v1/Systems/1"; "" for IPMI.
	Request string
	// Status is the HTTP status (Redfish) or 0.
	Status int
	// Code is the Redfish MessageId or the IPMI completion code as "0xD5".
	Code string
	// Message is the BMC's text, sanitised of credentials by the driver.
	Message string
	// Kind is one of the sentinels above when the error is classified, else nil.
	Kind error
}

func (e *BMCError) Error() string {
	s := "bmc"
	if e.BMC != "" {
		s += " " + e.BMC
	}
	s += ": " + e.Op
	if e.Request != "" && !strings.HasSuffix(e.Op, e.Request) {
		s += ": " + e.Request
	}
	if e.Status != 0 {
		s += fmt.Sprintf(": HTTP %d", e.Status)
	}
	if e.Code != "" {
		s += ": " + e.Code
	}
	if e.Message != "" {
		s += ": " + e.Message
	}
	return s
}

// Unwrap returns the classified sentinel, so errors.Is(err, ErrTransient) works.
func (e *BMCError) Unwrap() error { return e.Kind }

// IsTransient reports whether err is worth retrying with backoff.
func IsTransient(err error) bool {
	return errors.Is(err, ErrTransient) || errors.Is(err, ErrUnreachable) || errors.Is(err, ErrTimeout)
}

// WithBMC returns err naming the BMC name (a Redfish endpoint or an IPMI
// address) once: "redfish: x" reads "redfish NAME: x", "ipmi: x" reads
// "ipmi NAME: x", a bare text gets "NAME: " in front; an error already
// naming it is returned as is. errors.Is and errors.As see through it.
// Drivers apply it to every error their methods return.
func WithBMC(name string, err error) error {
	if err == nil || name == "" || strings.Contains(err.Error(), name) {
		return err
	}
	return &namedError{name: name, err: err}
}

type namedError struct {
	name string
	err  error
}

func (e *namedError) Error() string {
	s := e.err.Error()
	for _, p := range []string{"redfish: ", "ipmi: ", "bmc: "} {
		if strings.HasPrefix(s, p) {
			return strings.TrimSuffix(p, ": ") + " " + e.name + ": " + s[len(p):]
		}
	}
	return e.name + ": " + s
}

func (e *namedError) Unwrap() error { return e.err }
