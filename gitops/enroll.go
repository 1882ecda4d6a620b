package gitops

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/machina-metal/machina/boot"
	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/macaddr"
	"github.com/machina-metal/machina/state"
)

// Auto-enrol defaults (MACHINA_METAL_AUTO_ENROLL=1).
const (
	// DefaultEnrollZone is the zone of auto-enrolled servers when none is
	// configured: no profile selects it until a reviewer changes the zone
	// in the proposal, so an enrolled machine is never deployed unreviewed.
	DefaultEnrollZone = "discovered"
	// DefaultEnrollMax bounds the auto-enrolled servers pending review.
	DefaultEnrollMax = 16
	// EnrolledPrefix starts the generated name of an auto-enrolled server.
	EnrolledPrefix = "auto-"
	// EnrolledTag is the servers.yaml tag of a proposed entry.
	EnrolledTag = "auto-enrolled"
)

// Errors of auto-enrolment. Compare with errors.Is.
var (
	// ErrEnrollLimit: as many auto-enrolled servers as EnrollConfig.Max
	// are pending review; an unknown MAC is not enrolled until one is
	// merged or retired.
	ErrEnrollLimit = errors.New("auto-enrol limit reached")
	// ErrEnrollConflict: the generated name is taken by a server with
	// another boot MAC.
	ErrEnrollConflict = errors.New("auto-enrol name conflict")
)

// EnrollConfig configures an [Enroller]. Every zero value is usable except
// Store.
type EnrollConfig struct {
	// Store is the observed state. Required.
	Store *state.Store
	// Desired returns the inventory acted on (nil: none yet). A MAC that
	// servers.yaml already names is never enrolled: the reconciler
	// registers it.
	Desired func() *inventory.Inventory
	// Zone is the zone of enrolled servers and of their proposed entries;
	// "" means DefaultEnrollZone. It must be an RFC 1123 label.
	Zone string
	// Max bounds the auto-enrolled servers pending review (enrolled, not in
	// servers.yaml, not retired), so a flood of made-up MACs cannot fill
	// the store; zero means DefaultEnrollMax.
	Max int
	// OnEnrolled, when set, is called after a new enrolment (the
	// controller triggers a planning pass).
	OnEnrolled func(name string)
	// Proposer pushes the enrolled servers' servers.yaml entries for
	// review (a [*Proposer]); nil proposes nothing (Run then only waits).
	Proposer EntryProposer
	// ProposeDelay is how long Run waits after a change before it
	// proposes, so machines that finish commissioning together share one
	// commit; zero means 2 s.
	ProposeDelay time.Duration
	// RetryBase and RetryCap bound the backoff after a failed proposal;
	// zero means 10 s and 10 minutes.
	RetryBase, RetryCap time.Duration
	// Logger: nil discards.
	Logger *slog.Logger
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// EntryProposer pushes an edit of servers.yaml for review; [*Proposer]
// implements it.
type EntryProposer interface {
	Propose(ctx context.Context, message string, edit func(servers []byte, inv *inventory.Inventory) ([]byte, error)) (Proposal, error)
}

// Enroller is the auto-enrol hook (boot.Enroller) over the state store: an
// unknown MAC that PXE-boots becomes a server named [EnrolledName] in the
// configured zone, with no BMC, moved new → commissioning at once so the
// boot servers answer it with the commissioning ramdisk and its
// single-use token. Safe for concurrent use; idempotent per MAC.
type Enroller struct {
	cfg EnrollConfig
	log *slog.Logger

	mu          sync.Mutex // serialises enrolments (the cap's count)
	lastRefusal time.Time  // rate-limits the refusal event
	refused     int        // refusals since the last event
}

// NewEnroller checks cfg and returns an Enroller.
func NewEnroller(cfg EnrollConfig) (*Enroller, error) {
	if cfg.Store == nil {
		return nil, errors.New("reconciler: EnrollConfig.Store is required")
	}
	if cfg.Zone == "" {
		cfg.Zone = DefaultEnrollZone
	}
	if !state.ValidName(cfg.Zone) {
		return nil, fmt.Errorf("reconciler: auto-enrol zone %q is not an RFC 1123 label", cfg.Zone)
	}
	if cfg.Max <= 0 {
		cfg.Max = DefaultEnrollMax
	}
	if cfg.Desired == nil {
		cfg.Desired = func() *inventory.Inventory { return nil }
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.ProposeDelay <= 0 {
		cfg.ProposeDelay = 2 * time.Second
	}
	if cfg.RetryBase <= 0 {
		cfg.RetryBase = 10 * time.Second
	}
	if cfg.RetryCap <= 0 {
		cfg.RetryCap = 10 * time.Minute
	}
	return &Enroller{cfg: cfg, log: cfg.Logger}, nil
}

// EnrolledName is the generated name of the server auto-enrolled from mac:
// "auto-" and the 12 lower-case hex digits of the MAC (an RFC 1123 label,
// stable per MAC).
func EnrolledName(mac net.HardwareAddr) string { return EnrolledPrefix + hex.EncodeToString(mac) }

// Discovered implements boot.Enroller. For a MAC no server has, it creates
// the server (state.Server.Enrolled set, no BMC), moves it to
// commissioning and returns the commissioning assignment. A MAC enrolled
// before gets its server's current assignment (a second PXE boot finds
// the same server; one left in new by a crash is moved on). Errors wrap
// boot.ErrInvalidMAC (multicast, zero or not 6 bytes), boot.ErrNotFound (a
// MAC servers.yaml names, which the reconciler registers), ErrEnrollLimit
// or ErrEnrollConflict.
func (e *Enroller) Discovered(ctx context.Context, d boot.Discovery) (boot.Assignment, error) {
	// Only a unicast, non-zero EUI-48 is a NIC that PXE-boots.
	if err := macaddr.Check(d.MAC); err != nil {
		return boot.Assignment{}, fmt.Errorf("auto-enrol %s: %w (%v)", d.MAC, boot.ErrInvalidMAC, err)
	}
	mac := d.MAC.String()
	if inv := e.cfg.Desired(); inv != nil {
		for _, s := range inv.Servers {
			if s.BootMAC == mac {
				return boot.Assignment{}, fmt.Errorf("auto-enrol %s: servers.yaml names it (%s), registering: %w", mac, s.Name, boot.ErrNotFound)
			}
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	snap, err := e.cfg.Store.Snapshot()
	if err != nil {
		return boot.Assignment{}, fmt.Errorf("auto-enrol %s: %w", mac, err)
	}
	name := EnrolledName(d.MAC)
	for _, s := range snap.Servers {
		if s.BootMAC == mac {
			return e.resume(*s, d) // a copy: resume may replace it
		}
	}
	if s, ok := snap.Servers[name]; ok {
		return boot.Assignment{}, fmt.Errorf("auto-enrol %s: %s exists with boot MAC %s: %w", mac, name, s.BootMAC, ErrEnrollConflict)
	}
	if n := e.pending(snap); n >= e.cfg.Max {
		e.refuse(mac, n)
		return boot.Assignment{}, fmt.Errorf("auto-enrol %s: %d servers pending review: %w", mac, n, ErrEnrollLimit)
	}
	mode := string(inventory.BootUEFI) // the inventory's default
	if d.Arch == 0 {                   // RFC 4578 §2.1: x86 BIOS
		mode = string(inventory.BootBIOS)
	}
	now := e.cfg.Now().UTC()
	srv, err := e.cfg.Store.CreateServer(state.Server{Name: name, Zone: e.cfg.Zone, BootMAC: mac, BootMode: mode,
		Enrolled: &state.Enrolment{At: now, Source: d.Source}})
	if err != nil {
		return boot.Assignment{}, fmt.Errorf("auto-enrol %s: %w", mac, err)
	}
	_, _ = e.cfg.Store.AppendEvent(state.Event{Server: name, Kind: "boot.enrolled", Actor: state.ActorController,
		Message: fmt.Sprintf("unknown MAC %s PXE-booted (%s, %s): auto-enrolled in zone %s, no BMC", mac, d.Source, ipOrUnknown(d), e.cfg.Zone)})
	e.log.Info("auto-enrolled", "machine", name, "mac", mac, "source", d.Source, "zone", e.cfg.Zone)
	a, err := e.resume(srv, d)
	if err == nil && e.cfg.OnEnrolled != nil {
		e.cfg.OnEnrolled(name)
	}
	return a, err
}

// resume answers for an existing server: one still new is moved to
// commissioning (an enrolled one only: any other waits for the reconciler).
func (e *Enroller) resume(s state.Server, d boot.Discovery) (boot.Assignment, error) {
	if s.Lifecycle == state.LifecycleNew && s.Enrolled != nil {
		moved, err := e.cfg.Store.Apply(state.Move{Server: s.Name, From: state.LifecycleNew, To: state.LifecycleCommissioning,
			Reason: "auto-enrolled: commissioning at first PXE boot (" + d.Source + ")"})
		switch {
		case err == nil:
			s = moved
		case errors.Is(err, state.ErrStaleTransition):
			if cur, gerr := e.cfg.Store.Server(s.Name); gerr == nil {
				s = cur
			}
		default:
			return boot.Assignment{}, fmt.Errorf("auto-enrol %s: %w", s.Name, err)
		}
	}
	mode := boot.ModeUEFI
	if s.BootMode == string(inventory.BootBIOS) {
		mode = boot.ModeBIOS
	}
	return boot.Assignment{MAC: d.MAC, Name: s.Name, Lifecycle: boot.Lifecycle(s.Lifecycle), Mode: mode}, nil
}

// pending counts the auto-enrolled servers awaiting review: enrolled, not
// in servers.yaml by name or boot MAC, not retired.
func (e *Enroller) pending(snap state.Snapshot) int {
	names, macs := map[string]bool{}, map[string]bool{}
	if inv := e.cfg.Desired(); inv != nil {
		for _, s := range inv.Servers {
			names[s.Name], macs[s.BootMAC] = true, true
		}
	}
	n := 0
	for _, s := range snap.Servers {
		if s.Enrolled != nil && s.Lifecycle != state.LifecycleRetired && !names[s.Name] && !macs[s.BootMAC] {
			n++
		}
	}
	return n
}

// refuse records a refused enrolment: an event at most once a minute
// (counting the refusals in between), so a flood of MACs cannot fill the
// event log either.
func (e *Enroller) refuse(mac string, n int) {
	e.refused++
	now := e.cfg.Now()
	if now.Sub(e.lastRefusal) < time.Minute {
		return
	}
	_, _ = e.cfg.Store.AppendEvent(state.Event{Kind: "boot.enroll_refused", Actor: state.ActorController,
		Message: fmt.Sprintf("auto-enrol refused %d unknown MAC(s), the last %s: %d servers pending review (limit %d); merge or retire them", e.refused, mac, n, e.cfg.Max)})
	e.log.Warn("auto-enrol limit reached", "mac", mac, "pending", n, "limit", e.cfg.Max, "refused", e.refused)
	e.lastRefusal, e.refused = now, 0
}

func ipOrUnknown(d boot.Discovery) string {
	if d.IP.IsValid() {
		return d.IP.String()
	}
	return "ip unknown"
}
