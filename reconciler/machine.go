package reconciler

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/machina-metal/machina/bmc"
	"github.com/machina-metal/machina/state"
)

// Machine is what the executor asks of one server's BMC, at the level it
// thinks in (metal3's provisioner interface): the hardware fallback rules
// live behind it, and the handlers only call these verbs. bmcMachine is
// the implementation over a bmc.Driver; the executor's tests use a
// recording fake (fakeMachine).
type Machine interface {
	// Netboot boots the machine into the network once: a one-time PXE
	// override (persistent on a BMC learned not to honour Once), else the
	// iPXE ISO for its boot mode from virtual media; then power on when
	// off, reset when on.
	Netboot(ctx context.Context) error
	// BootDisk sets the boot device to disk, persistently when the BMC
	// offers it and else once, and reads it back.
	BootDisk(ctx context.Context) error
	// Power performs a and records it (rebooting while a reset or cycle
	// is in flight; an unverified reset is recorded as such).
	Power(ctx context.Context, a bmc.PowerAction) error
	// Restart performs the reset or power cycle a of a journalled action
	// (servers.yaml actions.powerCycle) at most once per journal entry:
	// written ahead on the entry, and read back from the BMC first when
	// the entry is resumed after a crash or a failover.
	Restart(ctx context.Context, a bmc.PowerAction) error
	// PowerState reads the power state from the BMC.
	PowerState(ctx context.Context) (bmc.PowerState, error)
}

// bmcMachine is the Machine of one server over its BMC driver. It records
// what it learns about the BMC on the server's record (OnceNotHonoured,
// RestoreDisk, ResetUnverified) and its power as commanded.
type bmcMachine struct {
	st     *state.Store
	drv    bmc.Driver
	obs    state.Server
	mode   bmc.BootMode
	isoURL string // the virtual-media boot ISO for mode (and Secure Boot); "" disables the fallback
	log    *slog.Logger
	now    func() time.Time
}

// machine returns the Machine of obs over drv, booting in mode; sb says
// the server's profile turns UEFI Secure Boot on (firmware.secureBoot).
func (c *Controller) machine(drv bmc.Driver, obs state.Server, mode bmc.BootMode, sb bool, log *slog.Logger) Machine {
	return &bmcMachine{st: c.cfg.Store, drv: drv, obs: obs, mode: mode, isoURL: c.isoURL(mode, sb), log: log, now: c.cfg.Now}
}

// isoURL is the virtual-media boot ISO for a server booting in mode:
// SBISOURL for a Secure Boot server (sb; firmware with Secure Boot on
// refuses Debian's unsigned iPXE, so such a server never gets an iPXE ISO,
// and gets none at all when SBISOURL is unset), UEFIISOURL for UEFI,
// ISOURL for BIOS and for an unset mode (the BMC's current mode, legacy
// on the BMCs that leave it unset).
func (c *Controller) isoURL(mode bmc.BootMode, sb bool) string {
	switch {
	case sb:
		return c.cfg.SBISOURL
	case mode == bmc.BootModeUEFI:
		return c.cfg.UEFIISOURL
	}
	return c.cfg.ISOURL
}

// secureBoot reports whether the profile of x's server turns UEFI Secure
// Boot on (firmware.secureBoot: true).
func (x *stepCtx) secureBoot() bool {
	if x.ws == nil || x.desired == nil {
		return false
	}
	p := x.desired.Profile(x.ws.Profile)
	return p != nil && p.Firmware != nil && p.Firmware.SecureBoot != nil && *p.Firmware.SecureBoot
}

// Netboot sets a one-time PXE boot override and starts the machine: power
// on when off, reset when on. A BMC without boot override support boots the
// iPXE ISO for its boot mode (isoURL) from virtual media instead, when
// that ISO's URL is configured. A BMC that does not honour a one-time
// override (bmc.OnceError) is remembered (BMCFacts.OnceNotHonoured: later
// netboots ask for Continuous at once), a persistent override is used, and
// BMCFacts.RestoreDisk makes the plan set disk back after the boot it was
// for.
//
// Read back first: when the journal entry being resumed already sent its
// power action (InFlight.PowerSent, by this process before a crash or by
// the leader before a failover) and the BMC reads on, the machine is
// booting (or has booted) for this entry: nothing is sent again, neither
// a second reset nor a fresh one-time override it may already have
// consumed. A machine that then never reports is network-booted again by
// the plan's silent-machine rule, as a new journal entry. Off means the
// earlier action did not take: the netboot runs as new.
//
// The steps run as one bmc.ShareReads operation: a driver that shares
// reads (Redfish) answers the power read that picks on or reset, and the
// power action's own first read, from the boot override's read-back
// instead of asking the BMC twice more; every read that verifies still
// asks it.
func (m *bmcMachine) Netboot(ctx context.Context) error {
	ctx = bmc.ShareReads(ctx)
	drv, log := m.drv, m.log
	if f := m.obs.InFlight; f != nil && !f.PowerSent.IsZero() {
		ps, err := drv.PowerState(ctx)
		if err != nil {
			return fmt.Errorf("read power: %w", err)
		}
		if ps == bmc.PowerOn {
			log.Info("resumed netboot: power action already sent for this journal entry and the BMC reads on; not repeating it",
				"sent", f.PowerSent.Format(time.RFC3339), "attempt", f.Attempt)
			return nil
		}
		log.Info("resumed netboot: BMC reads off although the power action was sent; netbooting again", "sent", f.PowerSent.Format(time.RFC3339))
	}
	dev := bmc.BootPXE
	atPowerOn, err := m.netbootOverride(ctx, dev)
	if iso := m.isoURL; errors.Is(err, bmc.ErrUnsupported) && iso != "" {
		log.Info("no PXE boot override; booting the iPXE ISO from virtual media", "iso", iso)
		if err = drv.InsertMedia(ctx, iso); err == nil {
			dev = bmc.BootCD
			atPowerOn, err = m.netbootOverride(ctx, dev)
		}
	}
	if err != nil {
		return fmt.Errorf("set boot override: %w", err)
	}
	ps, err := drv.PowerState(ctx)
	if err != nil {
		return fmt.Errorf("read power: %w", err)
	}
	action := bmc.PowerActionOn
	if ps == bmc.PowerOn {
		action = bmc.PowerActionReset
	}
	if ps == bmc.PowerOn && atPowerOn {
		// A reset would boot the device the machine runs with: off, read
		// the new one back, then on.
		if err := m.offAndReadBack(ctx, dev); err != nil {
			return err
		}
		action = bmc.PowerActionOn
	}
	if err := m.markPowerSent(true, time.Time{}); err != nil {
		return err
	}
	if err := m.Power(ctx, action); err != nil {
		if !ambiguous(err) {
			// The BMC answered (or was never reached): it did not act, so
			// a retry of this entry may send the action again.
			_ = m.markPowerSent(false, time.Time{})
		}
		return fmt.Errorf("power %s: %w", action, err)
	}
	log.Info("netboot", "power", string(action))
	return nil
}

// Restart performs the reset or power cycle a for the server's journal
// entry, write-ahead: before the request goes out the entry records
// PowerSent and, on a BMC with a reset clock (bmc.ResetClock: Redfish
// LastResetTime), the BMC's last reset time as ResetMark.
//
// Read back first: a resumed entry (PowerSent set: this process before a
// crash, or the leader before a failover, may have sent it) asks the BMC
// whether the system restarted since, and sends nothing again when it did:
//   - LastResetTime differs from ResetMark: it did (the BMC's own clock on
//     both sides, so skew does not matter);
//   - no ResetMark but a LastResetTime (the BMC did not report one before):
//     it did when LastResetTime is not before PowerSent (controller and
//     BMC clocks compared; NTP on both is assumed);
//   - LastResetTime unchanged, or not after PowerSent: it did not; the
//     reset is sent again;
//   - no LastResetTime at all (IPMI, iLO 5, XCC): off means the action did
//     not finish, and it is sent again (a reset or cycle of a stopped
//     machine powers it on); on cannot tell, and the reset is not repeated
//     (at most once, as for a netboot): the server records it as
//     unverified (BMCFacts.ResetUnverified, event power.resume_unverified)
//     and the operator bumps the counter again if it was lost.
//
// Without a journal entry it is Power.
func (m *bmcMachine) Restart(ctx context.Context, a bmc.PowerAction) error {
	f := m.obs.InFlight
	if f == nil {
		return m.Power(ctx, a)
	}
	rc, hasClock := m.drv.(bmc.ResetClock)
	if !f.PowerSent.IsZero() {
		done, err := m.restartedSince(ctx, f, rc, hasClock, a)
		if err != nil || done {
			return err
		}
	}
	var mark time.Time
	if hasClock {
		_, t, ok, err := rc.LastReset(ctx)
		if err != nil {
			return fmt.Errorf("read last reset time: %w", err)
		}
		if ok {
			mark = t
		}
	}
	if err := m.markPowerSent(true, mark); err != nil {
		return err
	}
	if err := m.Power(ctx, a); err != nil {
		if !ambiguous(err) {
			_ = m.markPowerSent(false, time.Time{})
		}
		return err
	}
	return nil
}

// restartedSince reads the BMC back for a resumed restart entry f (see
// Restart) and reports whether the system restarted since f's reset was
// sent, so it must not be sent again.
func (m *bmcMachine) restartedSince(ctx context.Context, f *state.InFlight, rc bmc.ResetClock, hasClock bool, a bmc.PowerAction) (bool, error) {
	log := m.log.With("sent", f.PowerSent.Format(time.RFC3339Nano), "attempt", f.Attempt)
	var (
		ps   bmc.PowerState
		last time.Time
		ok   bool
		err  error
	)
	if hasClock {
		ps, last, ok, err = rc.LastReset(ctx)
	} else {
		ps, err = m.drv.PowerState(ctx)
	}
	if err != nil {
		return false, fmt.Errorf("read back resumed %s: %w", a, err)
	}
	switch {
	case ok && !f.ResetMark.IsZero() && !last.Equal(f.ResetMark):
		log.Info("resumed power action: the BMC reset the system since it was sent (LastResetTime changed); not repeating it",
			"action", string(a), "lastResetBefore", f.ResetMark.Format(time.RFC3339Nano), "lastReset", last.Format(time.RFC3339Nano))
	case ok && f.ResetMark.IsZero() && !last.Before(f.PowerSent):
		log.Info("resumed power action: the BMC's LastResetTime is after it was sent; not repeating it",
			"action", string(a), "lastReset", last.Format(time.RFC3339Nano))
	case ok:
		log.Info("resumed power action: the BMC shows no reset since it was sent; sending it again",
			"action", string(a), "lastReset", last.Format(time.RFC3339Nano))
		return false, nil
	case ps == bmc.PowerOff:
		log.Info("resumed power action: the BMC reads off and reports no reset time; sending it again", "action", string(a))
		return false, nil
	default:
		msg := fmt.Sprintf("resumed %s after a controller restart or failover: the BMC reads %s and reports no LastResetTime, so whether the earlier request took is unknown; not repeated (bump the counter to ask again)", a, ps)
		log.Warn("resumed power action not verifiable; not repeating it", "action", string(a), "power", string(ps))
		if _, err := m.st.UpdateServer(m.obs.Name, func(s *state.Server) error { s.BMC.ResetUnverified = msg; return nil }); err != nil {
			return false, err
		}
		_, _ = m.st.AppendEvent(state.Event{Server: m.obs.Name, Kind: "power.resume_unverified", Actor: state.ActorController, Message: msg})
		return true, nil
	}
	if ps == bmc.PowerOff {
		// Restarted, and off now (a cycle's off phase, or switched off
		// since): on, not a second reset.
		return true, m.Power(ctx, bmc.PowerActionOn)
	}
	return true, nil
}

// markPowerSent records on the journal entry (if the server has one) that
// its power action is going out (write-ahead, before the request), with
// the BMC's last reset time mark (zero when not read), or clears both when
// the BMC is known not to have acted.
func (m *bmcMachine) markPowerSent(sent bool, mark time.Time) error {
	f := m.obs.InFlight
	if f == nil {
		return nil
	}
	var at time.Time
	if sent {
		now := m.now
		if now == nil {
			now = time.Now
		}
		at = now().UTC()
	}
	_, err := m.st.UpdateServer(m.obs.Name, func(s *state.Server) error {
		if s.InFlight != nil && s.InFlight.Key == f.Key {
			s.InFlight.PowerSent, s.InFlight.ResetMark = at, mark
		}
		return nil
	})
	return err
}

// ambiguous reports whether a failed BMC request may still have acted: it
// timed out or its context ended while waiting for the answer.
func ambiguous(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) || (errors.As(err, &ne) && ne.Timeout())
}

// netbootOverride sets dev as the boot device for the next boot: once,
// or persistently on a BMC learned not to honour Once. A BMC that keeps
// the override only in part (bmc.KeptError) has its quirks learned; the
// override is good enough when the device read back is dev, or when the
// device applies at the next power-on (atPowerOn: the caller powers off,
// reads back and powers on instead of resetting). On a BMC that does not
// keep the persistent flag (bmc.QuirkBootFlagsNotPersistent) a one-time
// override is not verifiable (VirtualBMC keeps the device for every boot):
// it is treated as persistent, and disk is set back after the boot.
func (m *bmcMachine) netbootOverride(ctx context.Context, dev bmc.BootDevice) (atPowerOn bool, _ error) {
	st, drv, obs, mode, log := m.st, m.drv, m.obs, m.mode, m.log
	o := bmc.BootOverride{Device: dev, Mode: mode, Persistent: obs.BMC.OnceNotHonoured}
	err := drv.SetBootOverride(ctx, o)
	if o.Persistent && errors.Is(err, bmc.ErrUnsupported) {
		// No Continuous offered (XCC lists Once and Disabled): ask Once;
		// a BMC that coerces it still ends with the override set.
		o.Persistent = false
		err = drv.SetBootOverride(ctx, o)
	}
	var oe *bmc.OnceError
	if errors.As(err, &oe) {
		msg := fmt.Sprintf("%s; using a persistent %s override from now on for this BMC, set back to disk after each boot it is for", oe.Error(), dev)
		log.Warn("one-time boot override not honoured", "outcome", string(oe.Outcome), "device", string(dev))
		if _, uerr := st.UpdateServer(obs.Name, func(s *state.Server) error { s.BMC.OnceNotHonoured = true; return nil }); uerr != nil {
			return false, uerr
		}
		_, _ = st.AppendEvent(state.Event{Server: obs.Name, Kind: "boot.once_not_honoured", Actor: state.ActorController, Message: msg})
		o.Persistent = true
		err = nil
		if oe.Got.Device != dev || !oe.Got.Persistent || (mode != bmc.BootModeUnset && oe.Got.Mode != mode) {
			err = drv.SetBootOverride(ctx, o)
		}
	}
	var ke *bmc.KeptError
	if errors.As(err, &ke) {
		if lerr := m.learnQuirks(ke); lerr != nil {
			return false, lerr
		}
		if ke.Got.Device == dev || ke.Has(bmc.QuirkBootDeviceAtPowerOn) {
			atPowerOn, err = ke.Has(bmc.QuirkBootDeviceAtPowerOn), nil
		}
	}
	if err != nil {
		return false, err
	}
	unverifiable := !o.Persistent && m.hasQuirk(bmc.QuirkBootFlagsNotPersistent)
	if o.Persistent || unverifiable {
		// Before the machine boots: its report may come quickly.
		if _, err := st.UpdateServer(obs.Name, func(s *state.Server) error { s.BMC.RestoreDisk = true; return nil }); err != nil {
			return false, err
		}
		msg := fmt.Sprintf("persistent %s boot override set (this BMC does not honour one-time overrides); disk is set back after this boot", dev)
		if unverifiable {
			msg = fmt.Sprintf("one-time %s boot override set on a BMC that does not keep the persistent flag (%s): whether it lasts past this boot is unknown, so disk is set back after this boot", dev, bmc.QuirkBootFlagsNotPersistent)
		}
		_, _ = st.AppendEvent(state.Event{Server: obs.Name, Kind: "boot.persistent_override", Actor: state.ActorController, Message: msg})
	}
	return atPowerOn, nil
}

// hasQuirk reports whether q was learned from this server's BMC.
func (m *bmcMachine) hasQuirk(q bmc.BootQuirk) bool {
	for _, x := range m.obs.BMC.Quirks {
		if x == string(q) {
			return true
		}
	}
	return false
}

// learnQuirks records ke's quirks on the server (BMCFacts.Quirks, status
// bmcQuirks). A quirk new to the record is logged at Warn and recorded as
// a bmc.quirk_learned event, once; one already known only at Debug.
func (m *bmcMachine) learnQuirks(ke *bmc.KeptError) error {
	var fresh []string
	for _, q := range ke.Quirks {
		if !m.hasQuirk(q) {
			fresh = append(fresh, string(q))
		}
	}
	if len(fresh) == 0 {
		m.log.Debug("boot override kept in part, as learned", "quirks", ke.Quirks)
		return nil
	}
	s, err := m.st.UpdateServer(m.obs.Name, func(s *state.Server) error {
		for _, q := range fresh {
			if !slices.Contains(s.BMC.Quirks, q) {
				s.BMC.Quirks = append(s.BMC.Quirks, q)
			}
		}
		slices.Sort(s.BMC.Quirks)
		return nil
	})
	if err != nil {
		return err
	}
	m.obs.BMC.Quirks = s.BMC.Quirks
	m.log.Warn("BMC quirk learned", "quirks", fresh, "detail", ke.Error())
	_, _ = m.st.AppendEvent(state.Event{Server: m.obs.Name, Kind: "bmc.quirk_learned", Actor: state.ActorController,
		Message: fmt.Sprintf("learned %s: %s", strings.Join(fresh, ", "), ke.Error())})
	return nil
}

// offAndReadBack powers the machine off and reads the boot override back:
// on a BMC that applies a new device at the next power-on
// (bmc.QuirkBootDeviceAtPowerOn) it must read dev once off, else the error
// wraps bmc.ErrMismatch.
func (m *bmcMachine) offAndReadBack(ctx context.Context, dev bmc.BootDevice) error {
	m.log.Info("boot device applies at the next power-on on this BMC: powering off first", "device", string(dev))
	if err := m.Power(ctx, bmc.PowerActionOff); err != nil {
		return fmt.Errorf("power off to apply the boot device: %w", err)
	}
	got, err := m.drv.BootOverride(ctx)
	if err != nil {
		return fmt.Errorf("read back boot override: %w", err)
	}
	if got.Device != dev {
		return fmt.Errorf("boot override to %s: read back %q with the machine off: %w", dev, got.Device, bmc.ErrMismatch)
	}
	return nil
}

// BootDisk sets the boot device to disk persistently and reads it back.
// Some BMCs offer only one-time overrides (Lenovo XCC lists Once and
// Disabled): then disk once, and the firmware's boot order does the rest.
// A BMC that keeps disk but not the persistent flag or the mode
// (bmc.KeptError: pyghmi/VirtualBMC and some AMI firmware) is good
// enough for a deployed server, whose iPXE script boots the local disk
// should it network-boot again; its quirks are learned. A BMC that
// applies the device at the next power-on (VirtualBMC over libvirt) gets
// a power-off and a read-back when the machine runs (a reset would not
// apply it), then a power-on when the server is deployed: it boots its
// disk; any other server stays off, as its agent powers it off after a
// commissioning report or a wipe.
//
// It runs as one bmc.ShareReads operation (see Netboot).
func (m *bmcMachine) BootDisk(ctx context.Context) error {
	ctx = bmc.ShareReads(ctx)
	drv, mode, log := m.drv, m.mode, m.log
	want := bmc.BootOverride{Device: bmc.BootDisk, Persistent: true, Mode: mode}
	err := drv.SetBootOverride(ctx, want)
	if errors.Is(err, bmc.ErrUnsupported) {
		log.Info("no persistent boot override on this BMC; setting disk once")
		want.Persistent = false
		err = drv.SetBootOverride(ctx, want)
		var oe *bmc.OnceError
		if errors.As(err, &oe) && oe.Got.Device == bmc.BootDisk {
			err = nil // disk every time is what we want anyway
		}
	}
	var ke *bmc.KeptError
	atPowerOn := false
	if errors.As(err, &ke) {
		if lerr := m.learnQuirks(ke); lerr != nil {
			return lerr
		}
		if ke.Got.Device == bmc.BootDisk || ke.Has(bmc.QuirkBootDeviceAtPowerOn) {
			atPowerOn, err = ke.Has(bmc.QuirkBootDeviceAtPowerOn), nil
		}
	}
	if err != nil {
		return fmt.Errorf("set boot override to disk: %w", err)
	}
	if atPowerOn {
		ps, err := drv.PowerState(ctx)
		if err != nil {
			return fmt.Errorf("read power: %w", err)
		}
		if ps == bmc.PowerOn {
			if err := m.offAndReadBack(ctx, bmc.BootDisk); err != nil {
				return err
			}
			if m.obs.Lifecycle != state.LifecycleDeployed {
				return nil // a commissioned or wiped machine stays off, as its agent left it
			}
			return m.Power(ctx, bmc.PowerActionOn)
		}
	}
	got, err := drv.BootOverride(ctx)
	if err != nil {
		return fmt.Errorf("read back boot override: %w", err)
	}
	if got.Device != bmc.BootDisk {
		return fmt.Errorf("boot override to disk: read back %q: %w", got.Device, bmc.ErrMismatch)
	}
	return nil
}

// Power performs a and records it: `rebooting` while a reset or cycle is
// in flight, then on. A reset the BMC accepted without evidence that it
// happened (bmc.ResetError) is recorded as unverified (event and
// BMCFacts.ResetUnverified, shown in status) and not as verified; the
// step goes on, and the phase deadline catches a machine that never
// restarted.
// PowerState implements Machine.
func (m *bmcMachine) PowerState(ctx context.Context) (bmc.PowerState, error) {
	return m.drv.PowerState(ctx)
}

func (m *bmcMachine) Power(ctx context.Context, a bmc.PowerAction) error {
	st, drv, obs, log := m.st, m.drv, m.obs, m.log
	restart := a == bmc.PowerActionReset || a == bmc.PowerActionCycle
	if restart {
		_, _ = st.SetPower(obs.Name, state.PowerRebooting, state.PowerSourceCommand)
	}
	err := drv.Power(ctx, a)
	var re *bmc.ResetError
	switch {
	case errors.As(err, &re):
		msg := re.Error()
		log.Warn("reset not verified", "action", string(a), "why", re.Why)
		_, _ = st.UpdateServer(obs.Name, func(s *state.Server) error { s.BMC.ResetUnverified = msg; return nil })
		_, _ = st.AppendEvent(state.Event{Server: obs.Name, Kind: "power.reset_unverified", Actor: state.ActorController, Message: msg})
		err = nil
	case err == nil && restart:
		ev := ""
		if r, ok := drv.(bmc.ResetEvidence); ok {
			ev = r.LastResetEvidence()
		}
		if ev != "" {
			log.Info("reset verified", "action", string(a), "evidence", ev)
		}
		if obs.BMC.ResetUnverified != "" {
			_, _ = st.UpdateServer(obs.Name, func(s *state.Server) error { s.BMC.ResetUnverified = ""; return nil })
		}
	}
	if err != nil {
		if restart {
			// Not rebooting any more: record what the BMC says now.
			if ps, perr := drv.PowerState(ctx); perr == nil && ps != bmc.PowerUnknown {
				p := state.PowerOn
				if ps == bmc.PowerOff {
					p = state.PowerOff
				}
				_, _ = st.SetPower(obs.Name, p, state.PowerSourceBMC)
			}
		}
		return err
	}
	if restart {
		_, _ = st.SetPower(obs.Name, state.PowerOn, state.PowerSourceCommand)
	}
	return nil
}
