package v1

import (
	"context"
	"net/http"
	"time"
)

// Join wire types (issue 11): enrolment tokens on the admin API, and the
// join listener's machine-facing endpoints (POST /hosts/join, heartbeats
// and join-log steps over mutual TLS).

// JoinNetwork is a Linux bridge over a NIC, optionally on an 802.1Q VLAN
// (VLAN 1-4094; 0 means untagged). CIDR, when set, is assigned to the
// bridge (e.g. "10.20.0.5/24").
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

// JoinInfo calls GET /api/v1/join/info.
func (c *Client) JoinInfo(ctx context.Context) (JoinInfo, error) {
	var out JoinInfo
	err := c.do(ctx, http.MethodGet, "/api/v1/join/info", nil, nil, &out)
	return out, err
}
