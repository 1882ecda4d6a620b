package v1

import (
	"context"
	"net/http"
	"net/url"
	"time"
)

// Join wire types: enrolment tokens on the admin API, and the
// join listener's machine-facing endpoints (POST /hosts/join, heartbeats
// and join-log steps over mutual TLS).

// JoinNetwork is a Linux bridge over a NIC, optionally on an 802.1Q VLAN
// (VLAN 1-4094; 0 means untagged). CIDR, when set, is the network's prefix
// (e.g. "10.20.0.0/24"), for validation and reporting only: the node agent
// never configures it as an address (the NIC's own addresses move to the
// bridge).
type JoinNetwork struct {
	Name   string `json:"name"`
	Bridge string `json:"bridge"`
	NIC    string `json:"nic"`
	VLAN   int    `json:"vlan,omitempty"`
	CIDR   string `json:"cidr,omitempty"`
}

// Storage pool types.
const (
	PoolDir = "dir" // a directory at Path
	PoolLVM = "lvm" // an LVM volume group named Name on Disks
)

// JoinPool is a storage pool: a directory (Type "dir", Path) or an LVM
// volume group (Type "lvm", Name is the VG name, Disks are block devices).
type JoinPool struct {
	Name  string   `json:"name"`
	Type  string   `json:"type"`
	Path  string   `json:"path,omitempty"`
	Disks []string `json:"disks,omitempty"`
}

// Host checks a join may require (profiles.yaml join.require).
const (
	CheckHostname = "hostname" // always required: an RFC 1123 label
	CheckVirt     = "virt"     // the CPU flags carry vmx (Intel VT-x) or svm (AMD-V)
	CheckKVM      = "kvm"      // /dev/kvm exists
	CheckMemory   = "memory"   // MemoryBytes >= the token's MinMemoryBytes
)

// EnrolmentRequest is the body of POST /api/v1/join/tokens. Every field is
// optional; TTL is a Go duration string ("30m"), default 1h, at most 7 days.
type EnrolmentRequest struct {
	Site     string        `json:"site,omitempty"`
	Rack     string        `json:"rack,omitempty"`
	Tags     []string      `json:"tags,omitempty"`
	Networks []JoinNetwork `json:"networks,omitempty"`
	Pools    []JoinPool    `json:"pools,omitempty"`
	// Require lists the checks (CheckVirt, CheckKVM, CheckMemory) whose
	// failure fails the join; the others are reported only.
	Require []string `json:"require,omitempty"`
	// MinMemoryBytes is the memory check's threshold; 0 means 1 GiB.
	MinMemoryBytes int64 `json:"minMemoryBytes,omitempty"`
	// Host, when set, is the only host name the token admits.
	Host string `json:"host,omitempty"`
	// Server names the inventory server the host runs on, when known.
	Server string `json:"server,omitempty"`
	// Deploy, when set, binds the token to one image deploy of Server
	// (the deploy plan token's ID): the join is accepted only once that
	// deploy's done was verified against its plan.
	Deploy string `json:"deploy,omitempty"`
	TTL    string `json:"ttl,omitempty"`
}

// EnrolmentToken answers POST /api/v1/join/tokens. Token is shown once;
// JoinURL, CAFingerprint (hex SHA-256 of the CA's SubjectPublicKeyInfo)
// and ScriptSHA256 (hex) are what a first-boot command pins.
type EnrolmentToken struct {
	Token         string    `json:"token"`
	ID            string    `json:"id"`
	ExpiresAt     time.Time `json:"expiresAt"`
	JoinURL       string    `json:"joinURL"`
	CAFingerprint string    `json:"caFingerprint"`
	ScriptSHA256  string    `json:"scriptSHA256"`
}

// JoinInfo answers GET /api/v1/join/info: what an installer pins, and the
// CA certificate (PEM) itself, over the authenticated admin API.
type JoinInfo struct {
	JoinURL       string `json:"joinURL"`
	CAFingerprint string `json:"caFingerprint"`
	ScriptSHA256  string `json:"scriptSHA256"`
	CA            string `json:"ca"`
}

// HostFacts is what a joining host says about itself.
type HostFacts struct {
	Hostname string `json:"hostname"`
	// CPUFlags are the virtualisation flags found in /proc/cpuinfo (vmx, svm).
	CPUFlags    []string `json:"cpuFlags,omitempty"`
	KVM         bool     `json:"kvm"` // /dev/kvm exists
	MemoryBytes int64    `json:"memoryBytes"`
}

// JoinRequest is the body of POST /hosts/join. CSR is a PEM "CERTIFICATE
// REQUEST" (PKCS #10, RFC 2986) for an ECDSA P-256/P-384, Ed25519 or
// RSA >= 2048 key.
type JoinRequest struct {
	Token string    `json:"token"`
	CSR   string    `json:"csr"`
	Facts HostFacts `json:"facts"`
}

// JoinCheck is one host check's outcome.
type JoinCheck struct {
	Name     string `json:"name"`
	OK       bool   `json:"ok"`
	Required bool   `json:"required"`
	Detail   string `json:"detail"`
}

// JoinResponse answers a successful POST /hosts/join: the node certificate
// and CA (PEM), the checks, and the networks and pools to apply.
type JoinResponse struct {
	Host        string        `json:"host"`
	Certificate string        `json:"certificate"`
	CA          string        `json:"ca"`
	Checks      []JoinCheck   `json:"checks"`
	Networks    []JoinNetwork `json:"networks,omitempty"`
	Pools       []JoinPool    `json:"pools,omitempty"`
	// HeartbeatSeconds is the interval the node should heartbeat at.
	HeartbeatSeconds int `json:"heartbeatSeconds"`
}

// JoinStep is the body of POST /hosts/{name}/steps (mutual TLS): one
// network or pool step's outcome, written to the host's join log.
type JoinStep struct {
	Step    string `json:"step"` // e.g. "network br0", "pool vg0"
	OK      bool   `json:"ok"`
	Message string `json:"message"`
}

// JoinDone is the body of POST /hosts/{name}/done (mutual TLS): the join's
// final outcome after every step.
type JoinDone struct {
	OK     bool   `json:"ok"`
	Reason string `json:"reason,omitempty"`
}

// Heartbeat is the body of POST /hosts/{name}/heartbeat (mutual TLS).
// An empty body (older agents) is a heartbeat without these facts.
type Heartbeat struct {
	// UptimeSeconds is the host's /proc/uptime (first field): a smaller
	// one than the last heartbeat's tells a reboot.
	UptimeSeconds float64 `json:"uptimeSeconds,omitempty"`
	// AgentUptimeSeconds is how long this node agent process has run: it
	// restarting on the same boot tells an agent restart.
	AgentUptimeSeconds float64 `json:"agentUptimeSeconds,omitempty"`
	// AgentStartedAt is when this agent process started, by the host's
	// clock; fixed for the process's life, so a new value is a new
	// process even seconds after the last.
	AgentStartedAt time.Time `json:"agentStartedAt,omitzero"`
	// AgentVersion is the node agent's build (git describe, or "dev").
	AgentVersion string `json:"agentVersion,omitempty"`
}

// HostLost is a host that missed its heartbeats for the lost window.
// Power is its server's power as the BMC read it after the loss
// ("powered_on", "powered_off"; "" until read, PowerError when it could
// not be), Summary the same for people ("lost, powered on").
type HostLost struct {
	Since      time.Time `json:"since"`
	Detected   time.Time `json:"detected"`
	Power      string    `json:"power,omitempty"`
	PowerAt    time.Time `json:"powerAt,omitzero"`
	PowerError string    `json:"powerError,omitempty"`
	Summary    string    `json:"summary"`
}

// HostFence is a fenced host: its server powered off (read back off)
// through Device ("bmc", or "fence ipmi ADDRESS"), by Actor (an admin
// token's name, "controller" for auto-fence), for Reason, at At.
type HostFence struct {
	At     time.Time `json:"at"`
	Actor  string    `json:"actor"`
	Reason string    `json:"reason"`
	Device string    `json:"device"`
	Auto   bool      `json:"auto,omitempty"`
	// NotHeld is set when the host heartbeats while fenced: the fence did
	// not hold (condition FenceFailed).
	NotHeld *FenceNotHeld `json:"notHeld,omitempty"`
}

// FenceNotHeld is a fenced host's heartbeats: the first and last (UTC)
// and how many.
type FenceNotHeld struct {
	Since      time.Time `json:"since"`
	Last       time.Time `json:"last"`
	Heartbeats int64     `json:"heartbeats"`
}

// HostCondition is a condition of a host (Type "HostLost", "Fenced"),
// with a CamelCase Reason and a message.
type HostCondition struct {
	Type    string    `json:"type"`
	Reason  string    `json:"reason"`
	Message string    `json:"message"`
	Since   time.Time `json:"since,omitzero"`
}

// FenceRequest is the body of POST /api/v1/hosts/{name}/fence and
// /unfence: why (required, at most 500 characters, recorded in the audit
// event with the admin token's name).
type FenceRequest struct {
	Reason string `json:"reason"`
}

// FenceResult answers a fence: the host, its server, what powered it off
// and the power read back ("powered_off").
type FenceResult struct {
	Host   string    `json:"host"`
	Server string    `json:"server"`
	Device string    `json:"device"`
	Power  string    `json:"power"`
	At     time.Time `json:"at"`
	Actor  string    `json:"actor"`
}

// Host is a joined host as the admin API shows it (GET /api/v1/hosts).
type Host struct {
	Name       string    `json:"name"`
	Server     string    `json:"server,omitempty"`
	Site       string    `json:"site,omitempty"`
	Rack       string    `json:"rack,omitempty"`
	Tags       []string  `json:"tags,omitempty"`
	Online     bool      `json:"online"`
	JoinedAt   time.Time `json:"joinedAt"`
	LastSeen   time.Time `json:"lastSeen,omitzero"`
	JoinStatus string    `json:"joinStatus,omitempty"`
	JoinReason string    `json:"joinReason,omitempty"`
	// Networks and StoragePools the node reported applied in its last join.
	Networks     []string `json:"networks,omitempty"`
	StoragePools []string `json:"storagePools,omitempty"`
	// BootedAt and AgentVersion come from the heartbeats (zero from older
	// agents).
	BootedAt     time.Time `json:"bootedAt,omitzero"`
	AgentVersion string    `json:"agentVersion,omitempty"`
	// Lost is set while the host misses its heartbeats; Fenced while its
	// server is fenced. Conditions lists both for display.
	Lost       *HostLost       `json:"lost,omitempty"`
	Fenced     *HostFence      `json:"fenced,omitempty"`
	Conditions []HostCondition `json:"conditions,omitempty"`
}

// HostList answers GET /api/v1/hosts.
type HostList struct {
	Items []Host `json:"items"`
}

// CreateEnrolmentToken calls POST /api/v1/join/tokens.
func (c *Client) CreateEnrolmentToken(ctx context.Context, req EnrolmentRequest) (EnrolmentToken, error) {
	var out EnrolmentToken
	err := c.do(ctx, http.MethodPost, "/api/v1/join/tokens", nil, req, &out)
	return out, err
}

// Hosts calls GET /api/v1/hosts.
func (c *Client) Hosts(ctx context.Context) (HostList, error) {
	var out HostList
	err := c.do(ctx, http.MethodGet, "/api/v1/hosts", nil, nil, &out)
	return out, err
}

// FenceHost calls POST /api/v1/hosts/{name}/fence: power the host's
// server off through its BMC or fencing device, read back off.
func (c *Client) FenceHost(ctx context.Context, name, reason string) (FenceResult, error) {
	var out FenceResult
	err := c.do(ctx, http.MethodPost, "/api/v1/hosts/"+url.PathEscape(name)+"/fence", nil, FenceRequest{Reason: reason}, &out)
	return out, err
}

// UnfenceHost calls POST /api/v1/hosts/{name}/unfence: clear the fence so
// the reconciler may power the server on again.
func (c *Client) UnfenceHost(ctx context.Context, name, reason string) (Host, error) {
	var out Host
	err := c.do(ctx, http.MethodPost, "/api/v1/hosts/"+url.PathEscape(name)+"/unfence", nil, FenceRequest{Reason: reason}, &out)
	return out, err
}

// JoinInfo calls GET /api/v1/join/info.
func (c *Client) JoinInfo(ctx context.Context) (JoinInfo, error) {
	var out JoinInfo
	err := c.do(ctx, http.MethodGet, "/api/v1/join/info", nil, nil, &out)
	return out, err
}
