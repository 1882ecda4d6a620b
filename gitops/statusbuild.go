package gitops

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/reconciler/plan"
	"github.com/machina-metal/machina/state"
)

// StatusBuilder turns the store, the latest plan and the Git source's view
// into the status writer's Snapshot. It keeps the few most recent events of
// each server in memory, read incrementally from the store, and the time
// each condition was first seen, so repeated builds of an unchanged fleet
// render identical bytes. Safe for concurrent use.
type StatusBuilder struct {
	// Store is read for servers, hosts and events. Required.
	Store *state.Store
	// EventsPerServer is how many recent events each server's status
	// shows; zero means 5.
	EventsPerServer int
	// Now is the clock of a plan condition's lastTransitionTime (when
	// this builder first saw it); nil means time.Now. Conditions read
	// from the server record (Ready, Stalled, Progressing) start at the
	// record's last update.
	Now func() time.Time
	// Include, if set, says which servers the status shows (a controller
	// group's: those of its zones, docs/ha.md "Sharding"); hosts are
	// shown when their server is. nil: every server and host. The record
	// is the snapshot's, shared with the store's cache: read-only.
	Include func(*state.Server) bool

	mu      sync.Mutex
	lastSeq uint64
	recent  map[string][]StatusEvent // newest last, at most EventsPerServer
	since   map[string]time.Time     // server/condition type/status → first seen
}

// Build returns the status snapshot of the fleet. inv is the Git source's
// inventory status; images the image states; res the latest plan (its
// conditions become server conditions).
func (b *StatusBuilder) Build(inv InventoryStatus, images []ImageStatus, res plan.Result) (Snapshot, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := time.Now()
	if b.Now != nil {
		now = b.Now()
	}
	if b.recent == nil {
		b.recent, b.since = map[string][]StatusEvent{}, map[string]time.Time{}
	}
	if err := b.readEvents(); err != nil {
		return Snapshot{}, err
	}
	snap, err := b.Store.Snapshot()
	if err != nil {
		return Snapshot{}, fmt.Errorf("status: snapshot: %w", err)
	}
	planConds := map[string][]plan.Condition{}
	for _, c := range res.Conditions {
		if name, ok := strings.CutPrefix(c.Subject, "server/"); ok {
			planConds[name] = append(planConds[name], c)
		}
	}
	out := Snapshot{Inventory: inv.WithPlan(res), Images: images}
	seen := map[string]bool{}
	for _, name := range slices.Sorted(maps.Keys(snap.Servers)) {
		if b.Include != nil && !b.Include(snap.Servers[name]) {
			continue
		}
		out.Servers = append(out.Servers, b.serverStatus(snap.Servers[name], planConds[name], now, seen))
	}
	for k := range b.since {
		if !seen[k] {
			delete(b.since, k)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(snap.Hosts)) {
		if b.Include != nil {
			h := snap.Hosts[name]
			if srv, ok := snap.Servers[cmp.Or(h.Server, h.Name)]; !ok || !b.Include(srv) {
				continue
			}
		}
		out.Hosts = append(out.Hosts, hostStatus(snap.Hosts[name]))
	}
	sort.Slice(out.Images, func(i, j int) bool { return out.Images[i].Name < out.Images[j].Name })
	return out, nil
}

// readEvents takes the store's events since the last Build and keeps the
// newest EventsPerServer (zero: 5) of each server.
func (b *StatusBuilder) readEvents() error {
	keep := b.EventsPerServer
	if keep <= 0 {
		keep = 5
	}
	for {
		evs, err := b.Store.Events(state.EventQuery{After: b.lastSeq, Limit: state.MaxPageSize})
		if err != nil {
			return fmt.Errorf("status: read events: %w", err)
		}
		for _, e := range evs {
			b.lastSeq = e.Seq
			if e.Server == "" {
				continue
			}
			// Kept in the rendered form: a fleet's worth of raw events
			// is several times larger, and Build hands these slices out
			// as they are (clipped, so no caller's append writes here).
			r := append(b.recent[e.Server], statusEvent(e))
			if len(r) > keep {
				r = r[len(r)-keep:]
			}
			b.recent[e.Server] = r
		}
		if len(evs) < state.MaxPageSize {
			return nil
		}
	}
}

// serverStatus is one server's status: its record, its hardware, its
// conditions (each with the time this builder first saw it, marked in
// seen) and its recent events.
func (b *StatusBuilder) serverStatus(s *state.Server, planConds []plan.Condition, now time.Time, seen map[string]bool) ServerStatus {
	name := s.Name
	ss := ServerStatus{Name: name, Zone: s.Zone, Lifecycle: string(s.Lifecycle), Power: string(s.Power.State), Health: s.Health, LastError: s.LastError}
	ss.BMCQuirks = slices.Sorted(slices.Values(s.BMC.Quirks))
	ss.BMCSecurity = s.BMC.Security
	if s.Allocation != nil {
		ss.Profile, ss.Allocation = s.Allocation.Profile, s.Allocation.Reason
	}
	for _, l := range s.Addresses {
		ss.Addresses = append(ss.Addresses, AddressStatus{Address: l.Address, Interface: l.Interface, Subnet: l.Subnet, Profile: l.Profile})
	}
	if hw := s.Hardware; hw != nil {
		ss.Hardware = statusHardware(hw)
	}
	if p := s.CurrentProgress(); p != nil && p.BytesTotal > 0 {
		size := fmt.Sprintf("%.1f GiB", float64(p.BytesTotal)/(1<<30))
		if p.BytesTotal < 1<<30 {
			size = fmt.Sprintf("%d MiB", p.BytesTotal>>20)
		}
		ss.Progress = fmt.Sprintf("%s %d%% of %s", p.Step, p.BytesDone*10/p.BytesTotal*10, size)
		if p.Retry != "" {
			ss.Progress += "; retrying: " + p.Retry
		}
	}
	ss.Firmware = statusFirmware(s.Firmware)
	if s.TPM != nil && s.TPM.EK != "" {
		ss.TPM = &TPMStatus{EK: s.TPM.EK, EKIssuer: s.TPM.EKIssuer}
	}
	ss.ObservedActions = inventory.Actions{Commission: s.Actions["commission"], PowerCycle: s.Actions["powerCycle"], PowerOn: s.Actions["powerOn"], PowerOff: s.Actions["powerOff"]}
	addAt := func(typ, status, reason, msg string, first time.Time) {
		key := name + "/" + typ + "/" + status
		seen[key] = true
		at, ok := b.since[key]
		if !ok {
			at = first.UTC().Truncate(time.Second)
			b.since[key] = at
		}
		ss.Conditions = append(ss.Conditions, Condition{Type: typ, Status: status, Reason: reason, Message: msg, LastTransitionTime: at})
	}
	recordConditions(s, func(typ, status, reason, msg string) { addAt(typ, status, reason, msg, s.UpdatedAt) })
	// A plan condition (Orphaned, Waiting, WipeFailed...) often comes
	// with no change of the record (a server deleted from servers.yaml):
	// it starts when this builder first sees it.
	for _, c := range planConds {
		addAt(c.Type, "True", c.Reason, c.Message, now)
	}
	ss.Events = slices.Clip(b.recent[name])
	return ss
}

// statusHardware is the commissioned hardware as status shows it (sizes
// in GiB).
func statusHardware(hw *state.Hardware) Hardware {
	out := Hardware{Vendor: hw.Vendor, Model: hw.Product, Serial: hw.Serial, Arch: hw.Arch, SMBIOSArch: hw.SMBIOSArch, Cores: hw.Cores, MemoryGiB: hw.MemoryBytes >> 30, Labels: hw.Labels()}
	for _, d := range hw.Disks {
		out.Disks = append(out.Disks, Disk{Name: d.Name, Model: d.Model, Serial: d.Serial, SizeGiB: d.SizeBytes >> 30})
	}
	for _, n := range hw.NICs {
		out.NICs = append(out.NICs, NIC{Name: n.Name, MAC: n.MAC, SpeedMbps: n.SpeedMbps, LLDP: n.LLDP})
	}
	return out
}

// recordConditions adds the conditions read from the server's record:
// Ready, the BMC's truth (reachable, certificate, boot-override and reset
// behaviour) and Stalled or Progressing.
func recordConditions(s *state.Server, add func(typ, status, reason, msg string)) {
	ready := "False"
	switch s.Lifecycle {
	case state.LifecycleReady, state.LifecycleDeployed:
		ready = "True"
	}
	add("Ready", ready, camel(string(s.Lifecycle)), "lifecycle "+string(s.Lifecycle))
	if s.BMCError != "" {
		add("BMCReachable", "False", "ReadFailed", "the controller's BMC sweep cannot read this BMC: "+s.BMCError)
	}
	if s.BMC.InsecureTLS {
		add("BMCCertificateVerified", "False", "InsecureTLS", "bmc.insecureTLS is set: the BMC's TLS certificate is not verified; trust its CA or certificate with bmc.caBundle instead")
	}
	if s.BMC.RestoreDisk {
		add("PersistentNetbootOverride", "True", "OnceNotHonoured", "the BMC does not honour one-time boot overrides: a persistent network-boot override is set, and the boot device is set back to disk after this boot")
	} else if s.BMC.OnceNotHonoured {
		add("OnceBootHonoured", "False", "Learned", "the BMC does not honour one-time boot overrides: netboots use a persistent override and set disk back afterwards")
	}
	if s.BMC.ResetUnverified != "" {
		add("ResetVerified", "False", "NoEvidence", s.BMC.ResetUnverified)
	}
	if s.TPM != nil && s.TPM.Refused != "" {
		add("TPMAttested", "False", "EKMismatch", fmt.Sprintf("%s (at %s): nothing is released to this machine; if the TPM was replaced, pin the new EK in servers.yaml tpm.ek", s.TPM.Refused, s.TPM.RefusedAt.UTC().Format(time.RFC3339)))
	}
	if s.Stalled != "" {
		msg := "not retried until the desired state or counter changes, its BMC settings change, or its credential is set again: " + s.LastError
		if s.InFlight != nil {
			msg = fmt.Sprintf("%s waits (attempt %d); %s", s.InFlight.Action, s.InFlight.Attempt, msg)
		}
		add("Stalled", "True", "ActionFailed", msg)
	} else if s.InFlight != nil {
		add("Progressing", "True", camel(s.InFlight.Action), fmt.Sprintf("%s, attempt %d", s.InFlight.Action, s.InFlight.Attempt))
	}
}

// hostStatus is one joined host's status. Online/offline changes with
// every heartbeat gap, so it stays out of status/ (deterministic files;
// the API and the UI show it); lost and fenced are states an operator
// acts on, and change only on loss, return or fence: they are in status/.
func hostStatus(h state.Host) HostStatus {
	st := h.JoinStatus
	if st == "" {
		st = "joined"
	}
	hs := HostStatus{Name: h.Name, Server: h.Server, Site: h.Site, Rack: h.Rack, Tags: h.Tags, State: st,
		Networks: h.Networks, StoragePools: h.StoragePools, Message: h.JoinReason, AgentVersion: h.AgentVersion}
	if l := h.Lost; l != nil {
		reason := "LostPowerUnknown"
		switch l.Power {
		case state.PowerOn:
			reason = "LostPoweredOn"
		case state.PowerOff:
			reason = "LostPoweredOff"
		}
		hs.State = l.Describe()
		hs.Conditions = append(hs.Conditions, Condition{Type: "HostLost", Status: "True", Reason: reason, LastTransitionTime: l.Detected,
			Message: l.Describe() + ": no heartbeat since " + l.Since.UTC().Format(time.RFC3339)})
	}
	if f := h.Fenced; f != nil {
		hs.State = "fenced"
		hs.Conditions = append(hs.Conditions, Condition{Type: "Fenced", Status: "True", Reason: map[bool]string{true: "FencedAutomatically", false: "FencedByOperator"}[f.Auto],
			LastTransitionTime: f.At, Message: fmt.Sprintf("fenced by %s through %s: %s; never powered on until machinactl host unfence %s", f.Actor, f.Device, f.Reason, h.Name)})
		if n := h.FenceNotHeld; n != nil {
			// It heartbeats while fenced: never shown as fenced and done.
			// The message names no count, so later heartbeats change no
			// status file.
			hs.State = "fenced, still heartbeating"
			hs.Conditions = append(hs.Conditions, Condition{Type: "FenceFailed", Status: "True", Reason: "HeartbeatWhileFenced",
				LastTransitionTime: n.Since, Message: fmt.Sprintf("fence did not hold: heartbeats since %s although %s read back off at %s",
					n.Since.UTC().Format(time.RFC3339), f.Device, f.At.UTC().Format(time.RFC3339))})
		}
	}
	return hs
}

// statusEvent renders a stored event for a server's status file: Warning
// for failures, stalls, refusals and moves to failed; the lifecycle move,
// if any, before the message.
func statusEvent(e state.Event) StatusEvent {
	typ := "Normal"
	if strings.Contains(string(e.Kind), "failed") || strings.Contains(string(e.Kind), "unverified") || strings.Contains(string(e.Kind), "not_honoured") || strings.Contains(string(e.Kind), "stalled") || strings.Contains(string(e.Kind), "refused") || e.To == state.LifecycleFailed {
		typ = "Warning"
	}
	msg := e.Message
	if e.From != "" || e.To != "" {
		msg = fmt.Sprintf("%s→%s: %s", e.From, e.To, e.Message)
	}
	return StatusEvent{Time: e.At.UTC(), Type: typ, Reason: camel(string(e.Kind)), Message: msg}
}

// camel turns "power-cycle" or "server.created" into "PowerCycle", "ServerCreated".
func camel(s string) string {
	var b strings.Builder
	up := true
	for _, r := range s {
		switch {
		case r == '-' || r == '_' || r == '.' || r == ' ':
			up = true
		case up:
			b.WriteString(strings.ToUpper(string(r)))
			up = false
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// statusFirmware summarises a firmware read for status; nil for none.
func statusFirmware(f *state.Firmware) *FirmwareStatus {
	if f == nil {
		return nil
	}
	fs := &FirmwareStatus{ReadAt: f.ReadAt, Components: len(f.Components), Created: slices.Sorted(slices.Values(f.CreatedVolumes)),
		Unsupported: slices.Sorted(maps.Keys(f.Unsupported))}
	if b := f.BIOS; b != nil {
		fs.Registry, fs.Attributes, fs.Pending = b.RegistryID, b.Attributes.Len(), len(b.Pending)
	}
	if sb := f.SecureBoot; sb != nil {
		fs.SecureBoot = "disabled"
		if sb.Enable {
			fs.SecureBoot = "enabled"
		}
	}
	for _, c := range f.Storage {
		for _, v := range c.Volumes {
			if v.RAIDType != "" {
				fs.Volumes = append(fs.Volumes, c.ID+"/"+v.Name+" "+v.RAIDType)
			}
		}
	}
	slices.Sort(fs.Volumes)
	return fs
}
