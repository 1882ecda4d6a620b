package gitops

import (
	"strings"
	"time"

	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/reconciler/plan"
	"github.com/machina-metal/machina/state"
)

// Snapshot is what the controller observed about the whole fleet, the input
// of [StatusWriter]. It is a plain value the caller fills from its state
// store; the writer renders it to status/ deterministically (entries sorted
// by name, free text redacted by [Redact]), so an unchanged fleet renders
// to identical bytes and produces no commit. Do not put times that change on
// every pass (heartbeats, "last polled") in it.
type Snapshot struct {
	// Inventory is the validity of the desired state.
	Inventory InventoryStatus
	// Servers, Images and Hosts may be in any order; names must be valid
	// file names (RFC 1123 labels, as the inventory requires), others are
	// skipped and reported by Render.
	Servers []ServerStatus
	Images  []ImageStatus
	Hosts   []HostStatus
}

// InventoryStatus is rendered to status/inventory.yaml.
type InventoryStatus struct {
	// Good is the revision the controller acts on (zero: none yet).
	Good RevisionRef `json:"good"`
	// Invalid is the newest invalid revision, nil when the branch tip is
	// valid. While it is set no new disk-writing operation starts.
	Invalid *InvalidRevision `json:"invalid"`
	// Held is what the safety brake holds back in the acting revision
	// until an operator approves it, nil when nothing is held.
	Held *HeldPlan `json:"held"`
	// Conditions are the acting plan's conditions about profiles rather
	// than one server, e.g. "profile/hypervisor" InsufficientCapacity when
	// too few ready servers fit a profile's count; rendered under
	// conditions: in status/inventory.yaml and listed on status/README.md.
	// Server conditions go to the server files and the brake's hold to
	// Held, not here.
	Conditions []plan.Condition `json:"conditions"`
}

// HeldPlan is the part of a plan the safety brake holds: why, and the
// steps it would take ("SERVER ACTION: why"), rendered under held: in
// status/inventory.yaml.
type HeldPlan struct {
	// Reason is Result.Brake, naming the `machinactl approve` revision.
	Reason string `json:"reason"`
	// Steps are the held steps in plan order.
	Steps []string `json:"steps"`
}

// RevisionRef names a revision by commit and digest.
type RevisionRef struct {
	Commit string `json:"commit"`
	Digest string `json:"digest"`
}

// ServerStatus is one server, rendered to status/servers/XX/NAME.yaml
// (see [ServerStatusPath]).
type ServerStatus struct {
	Name string
	// Zone is the server's zone from the inventory ("" if none); it is
	// counted in status/README.md, not written to the server's file.
	Zone string
	// Lifecycle is the state machine value: new, commissioning, ready,
	// allocated, deploying, deployed, failed, retired.
	Lifecycle string
	// Power is registered, powered_on, powered_off, rebooting or unknown.
	Power string
	// Health is a one-word summary: OK, Warning, Critical or "".
	Health string
	// BMCQuirks are the boot-override quirks learned from the server's
	// BMC (state.BMCFacts.Quirks), rendered sorted as bmcQuirks.
	BMCQuirks []string
	// BMCSecurity is what the BMC's last session negotiated, as the BMC
	// answered (state.BMCFacts.Security), rendered as bmcSecurity; "" is
	// not rendered.
	BMCSecurity string
	Hardware    Hardware
	// Firmware summarises the last firmware read of the server's BMC
	// (state.Firmware); nil when never read, then not rendered.
	Firmware *FirmwareStatus
	// TPM is the server's attested TPM 2.0 (state.TPM): the EK
	// fingerprint to pin as servers.yaml tpm.ek; nil before a verified
	// attestation, then not rendered. The attestation time is left out:
	// it changes on every boot, status only when the EK does.
	TPM *TPMStatus
	// Profile is the profile the server is allocated to ("" if none).
	Profile string
	// Allocation says why or how it is allocated ("auto", "pinned"), "".
	Allocation string
	// Addresses are the pool addresses IPAM holds for the server
	// (state.Server.Addresses), kept ones included; rendered as addresses,
	// sorted by address.
	Addresses []AddressStatus
	// Progress is the running deploy's progress as the ramdisk last
	// reported it, in whole tens of percent so that status commits do
	// not follow every report ("image-write 40% of 20.0 GiB"), followed
	// by "; retrying: " and the agent's failing request while it asks it
	// again (state.Progress.Retry); "" when none (rendered as progress).
	Progress string
	// Conditions in any order; rendered sorted by Type.
	Conditions []Condition
	// ObservedActions are the action counters last performed (recorded
	// only after the action finished).
	ObservedActions inventory.Actions
	// LastError is the last failure's message ("" if none); redacted.
	LastError string
	// Events are the most recent events, rendered newest first, at most
	// MaxEvents of StatusConfig.
	Events []StatusEvent
}

// AddressStatus is one pool address of a server: the address, the layout
// interface and subnet it is for, and the profile it was taken for.
type AddressStatus struct {
	Address   string
	Interface string
	Subnet    string
	Profile   string
}

// FirmwareStatus is the small firmware block of a server's status file:
// what the BMC reported, not the whole registry or inventory.
type FirmwareStatus struct {
	ReadAt time.Time
	// Registry is the BIOS AttributeRegistry's Id; Attributes how many
	// attributes the BIOS has; Pending how many settings wait for a reset.
	Registry   string
	Attributes int
	Pending    int
	// SecureBoot is "enabled", "disabled" or "" (not read).
	SecureBoot string
	// Volumes are "controller/name level", sorted; Created marks those
	// Machina created ("controller/name").
	Volumes []string
	Created []string
	// Components is the number of firmware inventory members.
	Components int
	// Unsupported are the areas the BMC has no resource for, sorted.
	Unsupported []string
}

// TPMStatus is a server's tpm block in status.
type TPMStatus struct {
	// EK is the fingerprint, "sha256:" and hex (attestation.Fingerprint).
	EK string
	// EKIssuer is the EK certificate's issuer, "" without one.
	EKIssuer string
}

// Hardware is the commissioning report's summary.
type Hardware struct {
	Vendor   string
	Model    string
	Serial   string
	CPUModel string
	// Arch is the architecture the commissioning report gave, as a
	// GOARCH name ("amd64", "arm64"; state.Hardware.Arch), "" from an
	// agent older than the arch fact.
	Arch string
	// SMBIOSArch is the architecture the firmware's SMBIOS tables state
	// (state.Hardware.SMBIOSArch, a GOARCH name), rendered as
	// hardware.smbiosArch; "" when they state none or the report predates
	// the field (then not rendered).
	SMBIOSArch string
	Cores      int
	MemoryGiB  int64
	// Disks in any order; rendered sorted by Name.
	Disks []Disk
	// NICs in any order; rendered sorted by Name.
	NICs []NIC
	// Labels are the labels derived from the report (state.Hardware.Labels)
	// that profile selectors match; rendered sorted by key.
	Labels map[string]string
}

// Disk is one block device.
type Disk struct {
	Name    string // kernel name, e.g. "nvme0n1"
	Model   string
	Serial  string
	SizeGiB int64
}

// NIC is one network interface.
type NIC struct {
	Name string // e.g. "eno1"
	MAC  string // lower-case colon form
	// SpeedMbps is the link speed, 0 if unknown or down.
	SpeedMbps int
	// LLDP is what the NIC heard from its switch port at commissioning,
	// rendered as switch, port and an lldp block; nil when nothing.
	LLDP *state.LLDP
}

// Condition follows the Kubernetes convention: Type (CamelCase, e.g.
// "Ready", "Stalled", "BMCReachable"), Status ("True", "False", "Unknown"),
// a CamelCase Reason, a human Message (redacted) and when Status last
// changed.
type Condition struct {
	Type               string
	Status             string
	Reason             string
	Message            string
	LastTransitionTime time.Time
}

// StatusEvent is one recorded event of a server.
type StatusEvent struct {
	Time    time.Time
	Type    string // "Normal" or "Warning"
	Reason  string // CamelCase
	Message string // redacted
}

// ImageStatus is one image, rendered to status/images/NAME.yaml.
type ImageStatus struct {
	Name string
	// State is pending, importing, ready or failed.
	State     string
	Checksum  string // "sha256:<hex>"
	SizeBytes int64
	Message   string // redacted
}

// HostStatus is one joined host, rendered to status/hosts/NAME.yaml.
type HostStatus struct {
	Name   string
	Server string // the server it runs on
	Site   string
	Rack   string
	Tags   []string
	// State is joining, joined, degraded or gone.
	State string
	// Networks and StoragePools applied, sorted by name when rendered.
	Networks     []string
	StoragePools []string
	Message      string // redacted
	// AgentVersion is the node agent's version from its heartbeats.
	AgentVersion string
	// Conditions are HostLost (reason LostPoweredOn, LostPoweredOff or
	// LostPowerUnknown: the power the BMC read after the loss) and Fenced.
	Conditions []Condition
}

// WithPlan returns inv with the plan's fleet-wide parts: Held from the
// brake's hold (Reason and each held step as "SERVER ACTION: why"), and
// Conditions from the conditions whose subject is not a server (server
// conditions go to the server files, the hold to Held). Conditions is
// empty, never nil, so JSON shows [].
func (inv InventoryStatus) WithPlan(res plan.Result) InventoryStatus {
	inv.Conditions = []plan.Condition{}
	for _, c := range res.Conditions {
		if !strings.HasPrefix(c.Subject, "server/") && c.Type != "Held" {
			inv.Conditions = append(inv.Conditions, c)
		}
	}
	inv.Held = nil
	if res.Brake != "" {
		held := &HeldPlan{Reason: res.Brake}
		for _, s := range res.Held {
			held.Steps = append(held.Steps, s.String())
		}
		inv.Held = held
	}
	return inv
}
