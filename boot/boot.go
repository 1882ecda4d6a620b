// Package boot holds what Machina's network boot servers share: the [Lookup]
// contract (boot MAC → [Assignment]), the auto-enrol hook ([Enroller]), the
// single-use token contract ([Tokens]). MACs are parsed and checked by
// package macaddr.
//
// boot is a leaf: it imports no other Machina package but macaddr. The
// protocol servers (boot/dhcp, boot/tftp, boot/ipxe) import only boot and
// macaddr, never state or reconciler; the adapter from the
// state store to these interfaces lives above them (reconciler or api), the
// way smee's handlers take a BackendReader.
package boot

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/machina-metal/machina/macaddr"
)

// Lifecycle is the provisioning lifecycle of a server as the controller
// records it (docs/architecture.md "Lifecycle and power"). The boot servers only read it
// to decide what a machine boots.
type Lifecycle string

// Lifecycle values, mirroring state's lifecycle machine.
const (
	LifecycleNew           Lifecycle = "new"
	LifecycleCommissioning Lifecycle = "commissioning"
	LifecycleReady         Lifecycle = "ready"
	LifecycleAllocated     Lifecycle = "allocated"
	LifecycleDeploying     Lifecycle = "deploying"
	LifecycleDeployed      Lifecycle = "deployed"
	LifecycleFailed        Lifecycle = "failed"
	LifecycleRetired       Lifecycle = "retired"
)

// Mode is the firmware boot mode of a server (inventory `bootMode`).
type Mode string

// Boot modes. ModeUnknown means the inventory gives none; the iPXE handler
// then trusts iPXE's own ${platform} report.
const (
	ModeUnknown Mode = ""
	ModeBIOS    Mode = "bios"
	ModeUEFI    Mode = "uefi"
)

// Assignment is what the boot servers know about one boot MAC.
type Assignment struct {
	// MAC is the boot MAC in canonical form (see [macaddr.MAC.String]).
	MAC net.HardwareAddr
	// Name is the server's inventory name (RFC 1123 label); empty for a MAC
	// that is only discovered.
	Name string
	// Lifecycle decides the iPXE script (ramdisk or local disk).
	Lifecycle Lifecycle
	// Wipe is set for a released server (lifecycle ready) whose disks still
	// wait for the release wipe: its iPXE script boots the ramdisk in wipe
	// mode instead of the local disk.
	Wipe bool
	// Installer is the distribution installer a deploying server boots
	// instead of the ramdisk: "autoinstall" (Ubuntu) or "kickstart" (RHEL
	// family); "" means the ramdisk's image deploy.
	Installer string
	// InstallerImage is the installer ISO's image name (RFC 1123-ish:
	// [a-z0-9._-]) when Installer is set.
	InstallerImage string
	// Mode is the inventory boot mode; ModeUnknown when not set.
	Mode Mode
	// IP is a DHCP reservation for this MAC; the zero Addr means "from the
	// pool".
	IP netip.Addr
	// Hostname is sent as DHCP option 12; empty means Name (none when both
	// are empty).
	Hostname string
	// SecureBoot is set for a server whose profile turns UEFI Secure Boot
	// on (inventory firmware.secureBoot: true). The boot servers then offer
	// it only the signed chain (shim, GRUB, the signed kernel; see
	// boot/secureboot.go), never iPXE: the DHCP server answers its x64 UEFI
	// PXE client with [ShimImageX64] and anything else with no boot file.
	SecureBoot bool
}

// Lookup maps a boot MAC to its assignment.
type Lookup interface {
	// Lookup returns the assignment for mac (canonical form), or an error
	// wrapping [ErrNotFound] when the MAC is not known. Implementations MUST
	// be safe for concurrent use and SHOULD return within a few milliseconds:
	// the DHCP server calls it once per packet.
	Lookup(ctx context.Context, mac net.HardwareAddr) (Assignment, error)
}

// Discovery is what a boot server saw of an unknown MAC, passed to
// [Enroller.Discovered].
type Discovery struct {
	MAC net.HardwareAddr
	// Source names the server that saw it: "dhcp", "ipxe".
	Source string
	// Arch is the DHCP option 93 client system architecture (RFC 4578 §2.1),
	// or -1 when absent.
	Arch int
	// IP is the client's address when known (HTTP peer); zero otherwise.
	IP netip.Addr
}

// Enroller is the auto-enrol hook (MACHINA_METAL_AUTO_ENROLL=1): unknown MACs
// are recorded as discovered and answered. Enrolment itself (giving the
// server a name and a lifecycle) belongs to a later layer.
type Enroller interface {
	// Discovered records d and returns the assignment to answer with
	// (normally lifecycle commissioning). It MUST be idempotent per MAC and
	// safe for concurrent use.
	Discovered(ctx context.Context, d Discovery) (Assignment, error)
}

// Tokens mints and checks the single-use, MAC-bound, short-lived tokens the
// iPXE scripts put on the ramdisk's kernel command line. The state store
// implements it (hashed at rest); [MemTokens] is an in-memory version.
type Tokens interface {
	// Issue returns a new token bound to mac and purpose, valid for ttl. The
	// returned string is the only copy of the secret: implementations MUST
	// store only a hash of it.
	Issue(ctx context.Context, mac net.HardwareAddr, purpose string, ttl time.Duration) (string, error)
	// Consume marks token as used if it is valid for mac and purpose. It
	// returns an error wrapping [ErrTokenInvalid] (unknown, or bound to
	// another MAC or purpose), [ErrTokenExpired] or [ErrTokenUsed]. Two
	// concurrent Consume calls of one token MUST NOT both succeed.
	Consume(ctx context.Context, mac net.HardwareAddr, purpose, token string) error
}

// PreparedTokens is implemented by [Tokens] that can mint a boot script's
// token ahead of the script request (when the controller netboots the
// machine) and hand it out later without a write: a boot storm's script
// requests then only read. The state store's adapter
// (api.BootIndex) implements it.
type PreparedTokens interface {
	// Prepare mints a token for mac's server and purpose, valid for ttl,
	// unless the server already has a live one (which a machine may hold):
	// it never revokes. prepared is false when nothing was minted.
	Prepare(ctx context.Context, mac net.HardwareAddr, purpose string, ttl time.Duration) (prepared bool, err error)
	// Take returns the prepared token for mac and purpose, once, if it is
	// still the server's live token with at least minLeft of its life
	// left; ok is false otherwise, and the caller then Issues one.
	Take(ctx context.Context, mac net.HardwareAddr, purpose string, minLeft time.Duration) (token string, ok bool, err error)
}

// Errors shared by the boot packages.
var (
	// ErrNotFound: the MAC has no assignment.
	ErrNotFound = errors.New("not found")
	// ErrInvalidMAC: the MAC is not a unicast, non-zero 48-bit MAC. It is
	// [macaddr.ErrInvalid] itself, so errors.Is matches either name.
	ErrInvalidMAC = macaddr.ErrInvalid
	// ErrTokenInvalid: the token is unknown or bound to another MAC/purpose.
	ErrTokenInvalid = errors.New("token invalid")
	// ErrTokenExpired: the token's lifetime is over.
	ErrTokenExpired = errors.New("token expired")
	// ErrTokenUsed: the token was consumed before.
	ErrTokenUsed = errors.New("token already used")
)

// AutoEnrollEnv names the environment variable that turns auto-enrolment on
// for the DHCP server and the iPXE handler (their Config.AutoEnroll).
const AutoEnrollEnv = "MACHINA_METAL_AUTO_ENROLL"

// AutoEnrollFromEnv reports whether getenv(AutoEnrollEnv) asks for
// auto-enrolment: "1", "true", "yes" or "on", in any case. Anything else,
// including unset, is off. cmd passes os.Getenv; tests pass a map lookup.
func AutoEnrollFromEnv(getenv func(string) string) bool {
	switch strings.ToLower(strings.TrimSpace(getenv(AutoEnrollEnv))) {
	case "1", "true", "yes", "on":
		return true
	}
	return false
}
