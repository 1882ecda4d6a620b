package reconciler

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/machina-metal/machina/bmc"
	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/state"
)

// run performs one step. Every handler is idempotent, so a step resumed
// from the journal after a restart or a failure can simply run again: it
// skips the lifecycle move already made and repeats the BMC calls, each of
// which reads back before it writes.
func (c *Controller) run(ctx context.Context, step Step, desired *inventory.Inventory, log *slog.Logger) error {
	st := c.cfg.Store
	var ws *inventory.Server
	if desired != nil {
		ws = desired.Server(step.Server)
	}
	switch step.Action {
	case ActRegister:
		if ws == nil {
			return nil
		}
		_, err := st.CreateServer(observedFrom(ws))
		if errors.Is(err, state.ErrExists) {
			return nil
		}
		if err == nil {
			log.Info("registered", "zone", ws.Zone, "bmc", ws.BMC.Address)
		}
		return err
	case ActUpdateIdentity:
		if ws == nil {
			return nil
		}
		o := observedFrom(ws)
		_, err := st.UpdateServer(step.Server, func(s *state.Server) error {
			s.Zone, s.Site, s.Rack, s.BootMAC, s.BootMode = o.Zone, o.Site, o.Rack, o.BootMAC, o.BootMode
			s.BMC.Driver, s.BMC.Address, s.BMC.Credentials = o.BMC.Driver, o.BMC.Address, o.BMC.Credentials
			s.BMC.SystemID, s.BMC.InsecureTLS = o.BMC.SystemID, o.BMC.InsecureTLS
			s.BMC.Auth, s.BMC.CABundle = o.BMC.Auth, o.BMC.CABundle
			s.Stalled = "" // new BMC settings deserve a new try
			return nil
		})
		return err
	case ActAllocate:
		image, deploy := "", ""
		if p := desired.Profile(step.Profile); p != nil {
			image, deploy = p.Image, string(p.Deploy)
			if c.cfg.ImageOf != nil {
				image = c.cfg.ImageOf(step.Profile)
			}
		}
		now := c.cfg.Now().UTC()
		_, err := st.Apply(state.Move{Server: step.Server, From: state.LifecycleReady, To: state.LifecycleAllocated, Reason: step.Why,
			Update: func(s *state.Server) error {
				s.Allocation = &state.Allocation{Profile: step.Profile, Image: image, At: now, Reason: step.AllocReason, Deploy: deploy}
				return nil
			}})
		if err == nil {
			log.Info("allocated", "profile", step.Profile, "reason", step.AllocReason)
		}
		return staleOK(err)
	case ActUnretire:
		_, err := st.Transition(step.Server, state.LifecycleRetired, state.LifecycleNew, step.Why)
		return staleOK(err)
	case ActAdopt:
		_, err := st.AdoptServer(step.From, step.Server, state.ActorController)
		if errors.Is(err, state.ErrNotFound) {
			return nil // adopted already (a resumed step); the next pass sees it
		}
		if err == nil {
			log.Info("adopted server record", "from", step.From)
		}
		return err
	}

	// Everything below talks to the BMC: journal it first.
	obs, err := c.journal(step)
	if err != nil {
		return err
	}
	// A server without a BMC (auto-enrolled, none attached yet) is only
	// ever given the steps that merely power off on the way: they skip it.
	var drv bmc.Driver
	if obs.BMC.Driver == "" {
		if step.Action.needsBMC() {
			return fmt.Errorf("%s: %w", step.Action, ErrNoBMC)
		}
		log.Info("no BMC: skipping power off", "action", string(step.Action))
	} else if drv, err = c.cfg.Drivers.Driver(ctx, obs); err != nil {
		return fmt.Errorf("open BMC: %w", err)
	}
	mode := bmc.BootModeUEFI
	if ws != nil && ws.BootMode == inventory.BootBIOS {
		mode = bmc.BootModeLegacy
	}

	switch step.Action {
	case ActCommission, ActDeploy:
		from, to := obs.Lifecycle, state.LifecycleCommissioning
		if step.Action == ActDeploy {
			to = state.LifecycleDeploying
		}
		if from != to {
			_, err := st.Apply(state.Move{Server: step.Server, From: from, To: to, Reason: step.Why, Update: func(s *state.Server) error {
				if to == state.LifecycleCommissioning {
					s.Allocation = nil
				}
				s.WipeStartedAt = time.Time{} // a running release wipe is cut short by this boot
				s.LastError = ""
				s.Renetboots, s.RenetbootAt = 0, time.Time{}
				return nil
			}})
			if err != nil {
				return err
			}
			log.Info("lifecycle", "from", from, "to", to)
		}
		if err := c.netboot(ctx, drv, obs, mode, log); err != nil {
			return err
		}
		if _, err := st.SetPower(step.Server, state.PowerOn, state.PowerSourceCommand); err != nil {
			return err
		}
	case ActRenetboot:
		if obs.Lifecycle != state.LifecycleCommissioning && obs.Lifecycle != state.LifecycleDeploying {
			return nil // heard from meanwhile, or moved on
		}
		now := c.cfg.Now().UTC()
		if _, err := st.UpdateServer(step.Server, func(s *state.Server) error {
			s.Renetboots++
			s.RenetbootAt = now
			return nil
		}); err != nil {
			return err
		}
		_, _ = st.AppendEvent(state.Event{Server: step.Server, Kind: "machine.renetboot", Message: step.Why})
		log.Warn("machine silent: re-netbooting", "why", step.Why)
		if err := c.netboot(ctx, drv, obs, mode, log); err != nil {
			return err
		}
		if _, err := st.SetPower(step.Server, state.PowerOn, state.PowerSourceCommand); err != nil {
			return err
		}
	case ActFinishDeploy, ActRestoreDisk:
		if err := bootDisk(ctx, drv, mode, log); err != nil {
			return err
		}
		if _, err := st.UpdateServer(step.Server, func(s *state.Server) error {
			if step.Action == ActFinishDeploy {
				s.FinishDeploy = false
			}
			s.BMC.RestoreDisk = false
			return nil
		}); err != nil {
			return err
		}
		if step.Action == ActRestoreDisk {
			_, _ = st.AppendEvent(state.Event{Server: step.Server, Kind: "boot.disk_restored", Actor: state.ActorController,
				Message: "the persistent network-boot override is replaced by disk (read back): " + step.Why})
		}
		log.Info("boot override set to disk (read back)")
	case ActRelease:
		if err := drv.Power(ctx, bmc.PowerActionOff); err != nil {
			return err
		}
		_, _ = st.SetPower(step.Server, state.PowerOff, state.PowerSourceCommand)
		if obs.Lifecycle == state.LifecycleDeployed {
			_, err := st.Apply(state.Move{Server: step.Server, From: state.LifecycleDeployed, To: state.LifecycleReady, Reason: step.Why,
				Update: func(s *state.Server) error { s.Allocation, s.NeedsWipe = nil, true; return nil }})
			if err != nil {
				return err
			}
			log.Info("released", "wipe", "next: the ramdisk's release wipe")
		}
		// Outside the move: a retried release still forgets the host.
		if _, err := st.ForgetHostsOf(step.Server, state.HostReleased, "server "+step.Server+" released: "+step.Why); err != nil {
			return err
		}
	case ActWipe:
		// Mark the wipe as running first: a ramdisk that reports quickly
		// then finds the record in the state it expects.
		now := c.cfg.Now().UTC()
		if _, err := st.UpdateServer(step.Server, func(s *state.Server) error {
			if s.Lifecycle != state.LifecycleReady || !s.NeedsWipe {
				return errWipeStale
			}
			s.WipeStartedAt = now
			return nil
		}); err != nil {
			if errors.Is(err, errWipeStale) {
				return c.done(step)
			}
			return err
		}
		if err := c.netboot(ctx, drv, obs, mode, log); err != nil {
			_, _ = st.UpdateServer(step.Server, func(s *state.Server) error { s.WipeStartedAt = time.Time{}; return nil })
			return err
		}
		if _, err := st.SetPower(step.Server, state.PowerOn, state.PowerSourceCommand); err != nil {
			return err
		}
		log.Info("release wipe started", "why", step.Why)
	case ActRetire:
		if drv != nil {
			if err := drv.Power(ctx, bmc.PowerActionOff); err != nil {
				return err
			}
			_, _ = st.SetPower(step.Server, state.PowerOff, state.PowerSourceCommand)
		}
		if obs.Lifecycle != state.LifecycleRetired {
			_, err := st.Apply(state.Move{Server: step.Server, From: obs.Lifecycle, To: state.LifecycleRetired, Reason: step.Why,
				Update: func(s *state.Server) error { s.Allocation, s.WipeStartedAt = nil, time.Time{}; return nil }})
			if err != nil {
				return err
			}
			log.Info("retired")
		}
		if _, err := st.ForgetHostsOf(step.Server, state.HostRetired, "server "+step.Server+" retired: "+step.Why); err != nil {
			return err
		}
	case ActTimeout:
		// Power off first so a machine stuck in the ramdisk stops; a BMC
		// that cannot do it does not keep the server from failing.
		if drv == nil {
			// No BMC: nothing to power off with.
		} else if err := drv.Power(ctx, bmc.PowerActionOff); err != nil {
			log.Warn("power off after deadline", "err", Redact(err.Error()))
		} else {
			_, _ = st.SetPower(step.Server, state.PowerOff, state.PowerSourceCommand)
		}
		if obs.Lifecycle == state.LifecycleReady && obs.NeedsWipe {
			now := c.cfg.Now().UTC()
			_, err := st.UpdateServer(step.Server, func(s *state.Server) error {
				if !s.NeedsWipe || s.WipeStartedAt.IsZero() {
					return nil // reported meanwhile
				}
				s.WipeStartedAt, s.WipeFailedAt, s.LastError = time.Time{}, now, step.Why
				s.WipeFailures++
				return nil
			})
			if err != nil {
				return err
			}
			_, _ = st.AppendEvent(state.Event{Server: step.Server, Kind: "wipe.failed", Message: step.Why})
			log.Warn("release wipe failed", "reason", step.Why)
		}
		if obs.Lifecycle == state.LifecycleCommissioning || obs.Lifecycle == state.LifecycleDeploying {
			_, err := st.Apply(state.Move{Server: step.Server, From: obs.Lifecycle, To: state.LifecycleFailed, Reason: step.Why,
				Update: func(s *state.Server) error { s.LastError = step.Why; s.Allocation = nil; return nil }})
			if err != nil {
				return staleOK(err)
			}
			log.Info("failed", "reason", step.Why)
		}
	case ActPowerOn, ActPowerOff, ActPowerCycle:
		a := map[Action]bmc.PowerAction{ActPowerOn: bmc.PowerActionOn, ActPowerOff: bmc.PowerActionOff, ActPowerCycle: bmc.PowerActionCycle}[step.Action]
		if err := c.power(ctx, drv, obs, a, log); err != nil {
			return err
		}
		p := state.PowerOn
		if a == bmc.PowerActionOff {
			p = state.PowerOff
		}
		_, _ = st.SetPower(step.Server, p, state.PowerSourceCommand)
		log.Info("power", "action", string(a))
	default:
		return fmt.Errorf("unknown action %q", step.Action)
	}
	return c.done(step)
}

// errWipeStale: the server no longer waits for a release wipe.
var errWipeStale = errors.New("no release wipe pending")

// netboot sets a one-time PXE boot override and starts the machine: power
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
func (c *Controller) netboot(ctx context.Context, drv bmc.Driver, obs state.Server, mode bmc.BootMode, log *slog.Logger) error {
	if f := obs.InFlight; f != nil && !f.PowerSent.IsZero() {
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
	err := c.netbootOverride(ctx, drv, obs, bmc.BootPXE, mode, log)
	if iso := c.isoURL(mode); errors.Is(err, bmc.ErrUnsupported) && iso != "" {
		log.Info("no PXE boot override; booting the iPXE ISO from virtual media", "iso", iso)
		if err = drv.InsertMedia(ctx, iso); err == nil {
			err = c.netbootOverride(ctx, drv, obs, bmc.BootCD, mode, log)
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
	if obs.InFlight != nil {
		// Write-ahead: the journal says the power action may have gone
		// out before it does (see above).
		now := c.cfg.Now().UTC()
		if _, err := c.cfg.Store.UpdateServer(obs.Name, func(s *state.Server) error {
			if s.InFlight != nil && s.InFlight.Key == obs.InFlight.Key {
				s.InFlight.PowerSent = now
			}
			return nil
		}); err != nil {
			return err
		}
	}
	if err := c.power(ctx, drv, obs, action, log); err != nil {
		if obs.InFlight != nil && !ambiguous(err) {
			// The BMC answered (or was never reached): it did not act, so
			// a retry of this entry may send the action again.
			_, _ = c.cfg.Store.UpdateServer(obs.Name, func(s *state.Server) error {
				if s.InFlight != nil && s.InFlight.Key == obs.InFlight.Key {
					s.InFlight.PowerSent = time.Time{}
				}
				return nil
			})
		}
		return fmt.Errorf("power %s: %w", action, err)
	}
	log.Info("netboot", "power", string(action))
	return nil
}

// ambiguous reports whether a failed BMC request may still have acted: it
// timed out or its context ended while waiting for the answer.
func ambiguous(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) || (errors.As(err, &ne) && ne.Timeout())
}

// netbootOverride sets dev as the boot device for the next boot: once, or
// persistently on a BMC learned not to honour Once.
func (c *Controller) netbootOverride(ctx context.Context, drv bmc.Driver, obs state.Server, dev bmc.BootDevice, mode bmc.BootMode, log *slog.Logger) error {
	st := c.cfg.Store
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
			return uerr
		}
		_, _ = st.AppendEvent(state.Event{Server: obs.Name, Kind: "boot.once_not_honoured", Actor: state.ActorController, Message: msg})
		o.Persistent = true
		err = nil
		if oe.Got.Device != dev || !oe.Got.Persistent || (mode != bmc.BootModeUnset && oe.Got.Mode != mode) {
			err = drv.SetBootOverride(ctx, o)
		}
	}
	if err != nil {
		return err
	}
	if o.Persistent {
		// Before the machine boots: its report may come quickly.
		if _, err := st.UpdateServer(obs.Name, func(s *state.Server) error { s.BMC.RestoreDisk = true; return nil }); err != nil {
			return err
		}
		_, _ = st.AppendEvent(state.Event{Server: obs.Name, Kind: "boot.persistent_override", Actor: state.ActorController,
			Message: fmt.Sprintf("persistent %s boot override set (this BMC does not honour one-time overrides); disk is set back after this boot", dev)})
	}
	return nil
}

// bootDisk sets the boot device to disk persistently and reads it back.
// Some BMCs offer only one-time overrides (Lenovo XCC lists Once and
// Disabled): then disk once, and the firmware's boot order does the rest.
func bootDisk(ctx context.Context, drv bmc.Driver, mode bmc.BootMode, log *slog.Logger) error {
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
	if err != nil {
		return fmt.Errorf("set boot override to disk: %w", err)
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

// power performs a and records it: `rebooting` while a reset or cycle is
// in flight, then on. A reset the BMC accepted without evidence that it
// happened (bmc.ResetError) is recorded as unverified (event and
// BMCFacts.ResetUnverified, shown in status) and not as verified; the
// step goes on, and the phase deadline catches a machine that never
// restarted.
func (c *Controller) power(ctx context.Context, drv bmc.Driver, obs state.Server, a bmc.PowerAction, log *slog.Logger) error {
	st := c.cfg.Store
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

// isoURL is the virtual-media iPXE ISO for a server booting in mode:
// UEFIISOURL for UEFI, ISOURL for BIOS and for an unset mode (the BMC's
// current mode, legacy on the BMCs that leave it unset).
func (c *Controller) isoURL(mode bmc.BootMode) string {
	if mode == bmc.BootModeUEFI {
		return c.cfg.UEFIISOURL
	}
	return c.cfg.ISOURL
}

// journal records step as in flight and returns the server record.
func (c *Controller) journal(step Step) (state.Server, error) {
	return c.cfg.Store.UpdateServer(step.Server, func(s *state.Server) error {
		attempt := 1
		if s.InFlight != nil && s.InFlight.Action == string(step.Action) {
			attempt = s.InFlight.Attempt + 1
		}
		key := fmt.Sprintf("%s/%d", step.Action, step.Counter)
		var sent time.Time
		if s.InFlight != nil && s.InFlight.Key == key {
			sent = s.InFlight.PowerSent // resumed: the BMC may have acted already
		}
		s.InFlight = &state.InFlight{Action: string(step.Action), Key: key, Started: c.cfg.Now().UTC(), Attempt: attempt, Counter: step.Counter, PowerSent: sent}
		return nil
	})
}

// done clears the journal and records the action counter as observed.
func (c *Controller) done(step Step) error {
	counter := map[Action]string{ActCommission: "commission", ActPowerOn: "powerOn", ActPowerOff: "powerOff", ActPowerCycle: "powerCycle"}[step.Action]
	_, err := c.cfg.Store.UpdateServer(step.Server, func(s *state.Server) error {
		s.InFlight, s.Stalled = nil, ""
		if step.Action != ActTimeout {
			// A timeout's outcome is the failure it records as LastError.
			s.LastError = ""
		}
		if counter != "" && step.Counter > 0 {
			if s.Actions == nil {
				s.Actions = map[string]int64{}
			}
			if step.Counter > s.Actions[counter] {
				s.Actions[counter] = step.Counter
			}
		}
		return nil
	})
	return err
}

func observedFrom(ws *inventory.Server) state.Server {
	return state.Server{Name: ws.Name, Zone: ws.Zone, Site: ws.Site, Rack: ws.Rack, BootMAC: ws.BootMAC, BootMode: string(ws.BootMode),
		BMC: state.BMCFacts{Driver: string(ws.BMC.Driver), Address: ws.BMC.Address, Credentials: ws.BMC.Credentials,
			SystemID: ws.BMC.SystemID, InsecureTLS: ws.BMC.InsecureTLS, Auth: ws.BMC.Auth, CABundle: ws.BMC.CABundle}}
}

// staleOK turns a stale transition (someone else already moved the server)
// into success: the plan is recomputed from the new state next pass.
func staleOK(err error) error {
	if errors.Is(err, state.ErrStaleTransition) {
		return nil
	}
	return err
}
