// Package v1 holds the JSON wire types of Machina's HTTP API under /api/v1
// and a small net/http client for them, shared by the server (package api),
// machinactl, the ramdisk agent and the node agent.
//
// v1 imports only the standard library: it is the whole trust boundary the
// agents link against.
package v1

import (
	"fmt"
	"strings"
	"time"
)

// Server is a server's observed state as the API returns it
// (GET /api/v1/servers, GET /api/v1/servers/{name}). It never holds a
// secret: BMC.Credentials is the name of a stored credential.
type Server struct {
	Name    string `json:"name"`
	Zone    string `json:"zone,omitempty"`
	Site    string `json:"site,omitempty"`
	Rack    string `json:"rack,omitempty"`
	BootMAC string `json:"bootMAC,omitempty"`
	// BootMode is the firmware interface from the inventory: uefi | bios.
	BootMode    string           `json:"bootMode,omitempty"`
	Lifecycle   string           `json:"lifecycle"` // new | commissioning | ready | allocated | deploying | deployed | failed | retired
	LifecycleAt time.Time        `json:"lifecycleAt"`
	Power       PowerStatus      `json:"power"`
	BMC         BMC              `json:"bmc"`
	Hardware    *Hardware        `json:"hardware,omitempty"`
	Allocation  *Allocation      `json:"allocation,omitempty"`
	Actions     map[string]int64 `json:"actions,omitempty"`
	LastError   string           `json:"lastError,omitempty"`
	// Health is the BMC's health rollup: OK | Warning | Critical, "" when unknown.
	Health string `json:"health,omitempty"`
	// BMCError is why the last BMC sweep could not read the BMC; "" when it could.
	BMCError string `json:"bmcError,omitempty"`
	// Stalled is the key of a disruptive action that failed and is not
	// retried until the desired state or counter changes; "" when not stalled.
	Stalled string `json:"stalled,omitempty"`
	// Addresses are the pool addresses the controller's IPAM holds for
	// the server (taken with its allocation; kept through a release on a
	// subnet whose release policy is keep).
	Addresses []AddressLease `json:"addresses,omitempty"`
	// FinishDeploy says the ramdisk reported a good deploy and the boot
	// override to disk is still to be set and read back.
	FinishDeploy bool `json:"finishDeploy,omitempty"`
	// NeedsWipe says a release wipe (partition tables and signatures, by
	// the ramdisk) is still to run or to succeed; such a server is not
	// allocated.
	NeedsWipe bool `json:"needsWipe,omitempty"`
	// Failures counts the controller's consecutive failed steps on the
	// server (reset by the next that succeeds); RetryAt is when the
	// failing step may run again (zero when none waits).
	Failures int       `json:"failures,omitempty"`
	RetryAt  time.Time `json:"retryAt,omitzero"`
	// InFlight names the action the controller started and has not
	// finished (its journal); "" when idle.
	InFlight string `json:"inFlight,omitempty"`
	// LastHeard is what the machine last did that the controller saw,
	// LastHeardAt when (a progress report counts only when its bytes
	// moved).
	LastHeard   string    `json:"lastHeard,omitempty"`
	LastHeardAt time.Time `json:"lastHeardAt,omitzero"`
	// BootFetch is the last ramdisk kernel or initrd the controller's
	// boot servers sent the machine; nil before one. While BootFetch.At
	// equals LastHeardAt nothing was heard from the machine since (a
	// silent machine then shows the BootStalled condition).
	BootFetch *BootFetch `json:"bootFetch,omitempty"`
	// Progress is the running deploy's latest progress report from the
	// ramdisk; nil when the server is not deploying or reported none
	// since its deploy (or last re-netboot) began.
	Progress *ServerProgress `json:"progress,omitempty"`
	// LastErase is each disk's outcome of the last release wipe's erase
	// (method, bytes, duration, verified samples); empty for a metadata
	// wipe.
	LastErase []DiskErase `json:"lastErase,omitempty"`
	// Enrolled is set on a server that enrolled itself by PXE-booting
	// with an unknown MAC (MACHINA_METAL_AUTO_ENROLL=1); nil otherwise.
	Enrolled  *Enrolment `json:"enrolled,omitempty"`
	Revision  uint64     `json:"revision"`
	CreatedAt time.Time  `json:"createdAt"`
	UpdatedAt time.Time  `json:"updatedAt"`
}

// ServerProgress is a deploy step's progress as the controller took it
// from the ramdisk (Progress): At is when the last report came, AdvancedAt
// when a report last moved the step or its bytes forward (equal to At
// while the step moves; falling behind it while the machine reports the
// same bytes).
type ServerProgress struct {
	Progress
	At         time.Time `json:"at"`
	AdvancedAt time.Time `json:"advancedAt,omitzero"`
}

// Enrolment says when an auto-enrolled server was first seen, by which
// boot server (dhcp | ipxe), and where its proposed servers.yaml entry went
// (Branch and Commit "" until pushed; ProposalError is the last failed
// attempt). Times are UTC.
type Enrolment struct {
	At            time.Time `json:"at"`
	Source        string    `json:"source,omitempty"`
	Branch        string    `json:"branch,omitempty"`
	Commit        string    `json:"commit,omitempty"`
	ProposedAt    time.Time `json:"proposedAt,omitzero"`
	ProposalError string    `json:"proposalError,omitempty"`
}

// PowerStatus is a power state (registered | powered_on | powered_off |
// rebooting) with its source (bmc | command) and time.
type PowerStatus struct {
	State  string    `json:"state"`
	Source string    `json:"source,omitempty"`
	At     time.Time `json:"at"`
	// OffClaimedAt is when the ramdisk said it powers the machine off,
	// while no BMC read of the controller's confirm-off (or a power
	// command) has settled it; absent otherwise.
	OffClaimedAt time.Time `json:"offClaimedAt,omitzero"`
}

// BMC is what Machina knows about a server's BMC.
type BMC struct {
	Driver          string `json:"driver,omitempty"`
	Address         string `json:"address,omitempty"`
	Credentials     string `json:"credentials,omitempty"` // a secret's name, never a password
	SystemID        string `json:"systemID,omitempty"`    // Redfish ComputerSystem Id on multi-system BMCs
	InsecureTLS     bool   `json:"insecureTLS,omitempty"` // Redfish: TLS verification skipped (inventory opt-out)
	Manufacturer    string `json:"manufacturer,omitempty"`
	Model           string `json:"model,omitempty"`
	SerialNumber    string `json:"serialNumber,omitempty"`
	FirmwareVersion string `json:"firmwareVersion,omitempty"`
}

// Hardware summarises a commissioning report.
type Hardware struct {
	Cores       int       `json:"cores"`
	MemoryBytes int64     `json:"memoryBytes"`
	Disks       []Disk    `json:"disks,omitempty"`
	NICs        []NIC     `json:"nics,omitempty"`
	Vendor      string    `json:"vendor,omitempty"`
	Product     string    `json:"product,omitempty"`
	Serial      string    `json:"serial,omitempty"`
	ObservedAt  time.Time `json:"observedAt"`
	// CPUVendor, Arch, InstalledMemoryBytes and GPUs feed the derived
	// labels (Labels); zero from reports of older agents.
	CPUVendor string `json:"cpuVendor,omitempty"`
	Arch      string `json:"arch,omitempty"`
	// SMBIOSArch is the GOARCH name the firmware's SMBIOS tables state
	// (CPU.SMBIOSArch of the report); "" when they state none or the
	// report predates the field. The plan weighs it against Arch.
	SMBIOSArch           string `json:"smbiosArch,omitempty"`
	InstalledMemoryBytes int64  `json:"installedMemoryBytes,omitempty"`
	GPUs                 []GPU  `json:"gpus,omitempty"`
	// Labels are the labels derived from the report (cpu.vendor,
	// cpu.arch, memory.gib, disk.nvme.count, nic.speed.max, gpu.vendor)
	// that profile selectors match.
	Labels map[string]string `json:"labels,omitempty"`
}

// Disk and NIC (agent.go) describe the hardware in both the agent report
// and the admin API.

// AddressLease is one pool address of a server: the networks.yaml subnet
// and the profile layout's interface it is for, the address (canonical
// text form), the profile it was taken for and when.
type AddressLease struct {
	Subnet    string    `json:"subnet"`
	Interface string    `json:"interface"`
	Address   string    `json:"address"`
	Profile   string    `json:"profile,omitempty"`
	At        time.Time `json:"at"`
}

// Allocation is the profile a server is allocated to.
type Allocation struct {
	Profile string    `json:"profile"`
	Image   string    `json:"image,omitempty"`
	At      time.Time `json:"at"`
	// Reason says why: pinned (want: deployed), count (a profile's count)
	// or provision (POST /api/v1/provision); "" from older controllers.
	Reason string `json:"reason,omitempty"`
}

// ServerList is one page of GET /api/v1/servers. Next, when non-empty, is
// the after= value for the following page.
type ServerList struct {
	Servers []Server `json:"servers"`
	Next    string   `json:"next,omitempty"`
}

// Event is one entry of the event log; in the SSE stream it is the data of
// an event whose id is Seq and whose event type is Kind.
type Event struct {
	Seq     uint64    `json:"seq"`
	At      time.Time `json:"at"`
	Server  string    `json:"server,omitempty"`
	Kind    string    `json:"kind"`
	Actor   string    `json:"actor,omitempty"` // an admin token's name, "controller" or "local"
	Role    string    `json:"role,omitempty"`  // the actor's role when the actor is an admin token
	From    string    `json:"from,omitempty"`
	To      string    `json:"to,omitempty"`
	Power   string    `json:"power,omitempty"`
	Message string    `json:"message,omitempty"`
}

// EventList is one page of events in ascending Seq. Next, when non-zero, is
// the after= value for the following page.
type EventList struct {
	Events []Event `json:"events"`
	Next   uint64  `json:"next,omitempty"`
}

// TransitionRequest is the body of POST /api/v1/servers/{name}/transitions.
// The move is compare-and-set: it succeeds only if the server is in From.
type TransitionRequest struct {
	From   string `json:"from"`
	To     string `json:"to"`
	Reason string `json:"reason,omitempty"` // at most 1024 bytes
}

// SecretRequest is the body of PUT /api/v1/secrets/{name}. It is a request
// only: no response carries a password. String redacts it.
type SecretRequest struct {
	Username string            `json:"username"`
	Password string            `json:"password"`
	Extra    map[string]string `json:"extra,omitempty"`
}

// String returns the request with the password and extra values redacted.
func (r SecretRequest) String() string {
	return fmt.Sprintf("SecretRequest{Username:%q Password:[redacted] Extra:%d fields}", r.Username, len(r.Extra))
}

// GoString is String, for %#v.
func (r SecretRequest) GoString() string { return r.String() }

// Secret describes a stored credential without its value.
type Secret struct {
	Name      string    `json:"name"`
	Sealed    bool      `json:"sealed"` // encrypted at rest with the master key
	UpdatedAt time.Time `json:"updatedAt"`
	UpdatedBy string    `json:"updatedBy,omitempty"`
}

// SecretList is GET /api/v1/secrets.
type SecretList struct {
	Secrets []Secret `json:"secrets"`
}

// SecretsStatus says whether the controller seals secrets at rest
// (MACHINA_API_KEY_MASTER_KEY set) and how many records are in each form.
type SecretsStatus struct {
	Sealing  bool `json:"sealing"`
	Sealed   int  `json:"sealed"`
	Unsealed int  `json:"unsealed"`
}

// Status is GET /api/v1/status: counts per lifecycle, the secrets'
// protection and the Git side's health, for `machinactl status` and the
// web UI.
type Status struct {
	Servers      map[string]int `json:"servers"` // lifecycle → count
	Secrets      SecretsStatus  `json:"secrets"`
	LastEventSeq uint64         `json:"lastEventSeq"`
	// Git is the inventory poller's and the status writer's health; nil
	// when the controller runs without a Git repository.
	Git *GitHealth `json:"git,omitempty"`
}

// GitHealth is the Git side's condition (the same figures as the
// machina_git_* metrics).
type GitHealth struct {
	// Poll is the inventory poller: LastSuccess is its last poll that
	// listed, fetched and evaluated the branch.
	Poll GitLoopHealth `json:"poll"`
	// Push is the status writer: LastSuccess is its last write that
	// pushed a status commit or found nothing to change.
	Push GitLoopHealth `json:"push"`
	// ActingCommit and ActingDigest are the inventory revision acted on
	// ("" before the first good one).
	ActingCommit string `json:"actingCommit,omitempty"`
	ActingDigest string `json:"actingDigest,omitempty"`
	// RemoteTip is the branch tip the remote listed at the last poll that
	// reached it; Evaluated the tip the poller last evaluated.
	RemoteTip string `json:"remoteTip,omitempty"`
	Evaluated string `json:"evaluated,omitempty"`
	// Behind is how many commits RemoteTip is ahead of Evaluated (first
	// parents); -1 when RemoteTip is not fetched (the fetch fails).
	Behind int `json:"behind"`
	// LastStatusCommit is the last status commit pushed and
	// LastStatusPackBytes the size of the pack it sent.
	LastStatusCommit    string `json:"lastStatusCommit,omitempty"`
	LastStatusPackBytes int    `json:"lastStatusPackBytes,omitempty"`
}

// GitLoopHealth is one Git loop's condition: when it last succeeded
// (absent: never), how many attempts failed since, and the last error
// (redacted; "" after a success). Failing is the status writer's
// "write-back failing" (FailingAfter consecutive failures) and, for the
// poller, any failure since the last success.
type GitLoopHealth struct {
	LastSuccess         *time.Time `json:"lastSuccess,omitempty"`
	ConsecutiveFailures int        `json:"consecutiveFailures"`
	Failing             bool       `json:"failing"`
	LastError           string     `json:"lastError,omitempty"`
}

// ProvisionRequest is the body of POST /api/v1/provision: allocate and
// deploy Count (1 to 1000) servers of Profile.
type ProvisionRequest struct {
	Profile string `json:"profile"`
	Count   int    `json:"count"`
}

// ProvisionResponse names the servers a provision request allocated.
type ProvisionResponse struct {
	Profile string   `json:"profile"`
	Servers []string `json:"servers"`
}

// ApproveRequest is the body of POST /api/v1/approve: 12 to 64 lower-case
// hex digits of the inventory digest whose held plan is approved.
type ApproveRequest struct {
	Revision string `json:"revision"`
}

// ApproveResponse is POST /api/v1/approve's answer. The approval is
// recorded in any case (it applies whenever a plan of that revision is
// held); Acting is the digest (hex) of the revision the controller acts on
// ("" before the first good revision), Matches whether Revision is a
// prefix of it, and HeldSteps how many steps the brake holds in its plan
// now: Matches with HeldSteps > 0 means the held steps run now, anything
// else that nothing held is released by this approval yet.
type ApproveResponse struct {
	Approved  string `json:"approved"`
	Acting    string `json:"acting,omitempty"`
	Matches   bool   `json:"matches"`
	HeldSteps int    `json:"heldSteps"`
}

// Error codes of the reconciler's admin routes.
const (
	CodeInsufficientCapacity = "insufficient_capacity" // 409 from POST /api/v1/provision
	CodeInvalidRevision      = "invalid_revision"      // 400 from POST /api/v1/approve
	CodeNotHeld              = "not_held"              // 409 from POST /api/v1/approve: the revision matches no held plan
)

// Health is GET /healthz.
type Health struct {
	Status string `json:"status"` // "ok"
}

// Error codes in Error.Code.
const (
	CodeBadRequest       = "bad_request"        // 400
	CodeUnauthorized     = "unauthorized"       // 401
	CodeTLSRequired      = "tls_required"       // 403: an admin route asked over plain HTTP off loopback
	CodeForbidden        = "forbidden"          // 403: the admin token's role does not allow the request (Error.Role names the role needed)
	CodeNotFound         = "not_found"          // 404
	CodeMethodNotAllowed = "method_not_allowed" // 405
	CodeConflict         = "conflict"           // 409: illegal or stale lifecycle move
	CodeTooLarge         = "too_large"          // 413
	CodeInternal         = "internal"           // 500
	CodeUnavailable      = "unavailable"        // 503
)

// Error is the body of every non-2xx answer. Lifecycle is set on 409
// answers to a transition: the server's current lifecycle.
type Error struct {
	Message   string `json:"error"`
	Code      string `json:"code"`
	Lifecycle string `json:"lifecycle,omitempty"`
	// Role, on a 403 with code "forbidden", is the role the request
	// needs (viewer, operator or admin).
	Role string `json:"role,omitempty"`
}

// AdminToken describes an admin API token (GET /api/v1/admin-tokens); its
// value is never listed.
type AdminToken struct {
	Name      string    `json:"name"`
	ID        string    `json:"id"`
	CreatedAt time.Time `json:"createdAt"`
	CreatedBy string    `json:"createdBy,omitempty"`
	// Role is viewer, operator or admin (tokens created before roles
	// are admin).
	Role string `json:"role"`
}

// AdminTokenList is GET /api/v1/admin-tokens.
type AdminTokenList struct {
	Tokens []AdminToken `json:"tokens"`
}

// AdminTokenRequest is the body of POST /api/v1/admin-tokens: the new
// token's name (an RFC 1123 label, unique), recorded as the actor of
// every change made with it.
type AdminTokenRequest struct {
	Name string `json:"name"`
	// Role is the new token's role: viewer, operator or admin; empty
	// means admin.
	Role string `json:"role,omitempty"`
}

// AdminTokenCreated is POST /api/v1/admin-tokens' answer: the record and
// the token's value, shown this once.
type AdminTokenCreated struct {
	AdminToken
	Token string `json:"token"`
}

// Approval is one recorded approval (GET /api/v1/approvals): the 12 to 64
// hex digits of an inventory digest and who approved it.
type Approval struct {
	Revision string `json:"revision"`
	Actor    string `json:"actor"`
}

// ApprovalList is GET /api/v1/approvals.
type ApprovalList struct {
	Approvals []Approval `json:"approvals"`
}

// Approves reports whether one of the approvals covers the inventory
// digest ("sha256:HEX" or bare hex): its revision is a prefix of it.
func (l ApprovalList) Approves(digest string) bool {
	hex := strings.TrimPrefix(digest, "sha256:")
	for _, a := range l.Approvals {
		if a.Revision != "" && strings.HasPrefix(hex, a.Revision) {
			return true
		}
	}
	return false
}

// Image is one image as the controller sees it (GET /api/v1/images): an
// entry of the acting inventory's images.yaml, a record of its image
// store, or both.
type Image struct {
	Name string `json:"name"`
	// InInventory says images.yaml of the acting revision names it.
	InInventory bool `json:"inInventory"`
	// State is the store's or the running import's state: pending,
	// downloading, converting, verified or failed; "" when the store has
	// no record yet.
	State string `json:"state,omitempty"`
	// Percent is 0-100 while downloading or converting, -1 when unknown.
	Percent float64 `json:"percent,omitempty"`
	// SizeBytes is the raw image's size once verified.
	SizeBytes int64 `json:"sizeBytes,omitempty"`
	// Digest is the verified raw image's digest ("sha256:HEX").
	Digest string `json:"digest,omitempty"`
	// Reason says why State is failed.
	Reason string `json:"reason,omitempty"`
	// ImportError is the last import attempt's error while the controller
	// retries it (with the attempt number and the next try's time), "" when
	// the last attempt succeeded or none failed.
	ImportError string `json:"importError,omitempty"`
}

// ImageList is GET /api/v1/images, sorted by name.
type ImageList struct {
	Items []Image `json:"items"`
}

// BootFetch is a boot file the controller's network boot servers sent a
// machine.
type BootFetch struct {
	// File is the name the machine asked for: "machina/ramdisk/vmlinuz"
	// by TFTP (the Secure Boot chain), "/boot/ramdisk/vmlinuz" by HTTP.
	File string `json:"file"`
	// Via is "tftp" or "http".
	Via string `json:"via"`
	// SecureBoot is set when the machine booted the Secure Boot chain.
	SecureBoot bool `json:"secureBoot,omitempty"`
	// At is when the transfer ended (UTC).
	At time.Time `json:"at"`
}
