package reconciler

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/machina-metal/machina/bmc"
	"github.com/machina-metal/machina/reconciler/plan"
	"github.com/machina-metal/machina/redact"
	"github.com/machina-metal/machina/state"
)

// register creates the observed record of a server new in servers.yaml
// (lifecycle new); one that exists already is left as it is.
func (c *Controller) register(_ context.Context, x *stepCtx) error {
	if x.ws == nil {
		return nil
	}
	_, err := c.cfg.Store.CreateServer(plan.Record(x.ws))
	if errors.Is(err, state.ErrExists) {
		return nil
	}
	if err == nil {
		x.log.Info("registered", "zone", x.ws.Zone, "bmc", x.ws.BMC.Address)
	}
	return err
}

// updateIdentity copies zone, site, rack, boot MAC and BMC settings from
// servers.yaml onto the record, and lifts a stall (new BMC settings
// deserve a new try). Another BMC (driver, address or system) forgets the
// quirks and session security learned from the old one.
func (c *Controller) updateIdentity(_ context.Context, x *stepCtx) error {
	if x.ws == nil {
		return nil
	}
	o := plan.Record(x.ws)
	_, err := c.cfg.Store.UpdateServer(x.step.Server, func(s *state.Server) error {
		s.Zone, s.Site, s.Rack, s.BootMAC, s.BootMode = o.Zone, o.Site, o.Rack, o.BootMAC, o.BootMode
		if s.BMC.Driver != o.BMC.Driver || s.BMC.Address != o.BMC.Address || s.BMC.SystemID != o.BMC.SystemID {
			// Another BMC: what was learned from the old one is not its.
			s.BMC.Quirks, s.BMC.Security = nil, ""
		}
		s.BMC.Driver, s.BMC.Address, s.BMC.Credentials = o.BMC.Driver, o.BMC.Address, o.BMC.Credentials
		s.BMC.SystemID, s.BMC.InsecureTLS = o.BMC.SystemID, o.BMC.InsecureTLS
		s.BMC.Auth, s.BMC.CABundle, s.BMC.MinCipherSuite = o.BMC.Auth, o.BMC.CABundle, o.BMC.MinCipherSuite
		s.Stalled = ""
		return nil
	})
	return err
}

// allocate moves a ready server to allocated for the step's profile,
// recording its image, deploy method and release erase methods (per disk
// from the server's commissioning report, plan.EraseDisks).
func (c *Controller) allocate(_ context.Context, x *stepCtx) error {
	step := x.step
	image, deploy, erase := "", "", ""
	prof := x.desired.Profile(step.Profile)
	if prof != nil {
		image, deploy, erase = prof.Image, string(prof.Deploy), string(prof.Erase)
		if c.cfg.ImageOf != nil {
			image = c.cfg.ImageOf(step.Profile)
		}
	}
	now := c.cfg.Now().UTC()
	// The pool addresses of the profile's layout are taken in the move's
	// transaction (state.Store.ApplyClaiming): an exhausted pool leaves
	// the server ready, never allocated without its addresses.
	srv, err := c.cfg.Store.ApplyClaiming(state.Move{Server: step.Server, From: state.LifecycleReady, To: state.LifecycleAllocated, Reason: step.Why,
		Update: func(s *state.Server) error {
			s.Allocation = &state.Allocation{Profile: step.Profile, Image: image, At: now, Reason: step.AllocReason, Deploy: deploy, Erase: erase,
				EraseDisks: plan.EraseDisks(prof, s.Hardware)}
			return nil
		}}, step.Profile, plan.Claims(x.desired, x.desired.Profile(step.Profile), step))
	if err == nil {
		x.log.Info("allocated", "profile", step.Profile, "reason", step.AllocReason, "addresses", leaseList(srv.Addresses))
	}
	return staleOK(err)
}

// unretire moves a retired server back to new.
func (c *Controller) unretire(_ context.Context, x *stepCtx) error {
	_, err := c.cfg.Store.Transition(x.step.Server, state.LifecycleRetired, state.LifecycleNew, x.step.Why)
	return staleOK(err)
}

// adopt moves an auto-enrolled server's record to its servers.yaml name.
func (c *Controller) adopt(_ context.Context, x *stepCtx) error {
	_, err := c.cfg.Store.AdoptServer(x.step.From, x.step.Server, state.ActorController)
	if errors.Is(err, state.ErrNotFound) {
		return nil // adopted already (a resumed step); the next pass sees it
	}
	if err == nil {
		x.log.Info("adopted server record", "from", x.step.From)
	}
	return err
}

// release powers a deployed server off, deletes the RAID volumes Machina
// created on it (deleteCreatedVolumes), moves it to ready marked for the
// ramdisk's release wipe, and forgets its joined host.
func (c *Controller) release(ctx context.Context, x *stepCtx) error {
	st, step := c.cfg.Store, x.step
	if err := x.m.Power(ctx, bmc.PowerActionOff); err != nil {
		return err
	}
	_, _ = st.SetPower(step.Server, state.PowerOff, state.PowerSourceCommand)
	if err := c.deleteCreatedVolumes(ctx, x); err != nil {
		return err
	}
	if x.obs.Lifecycle == state.LifecycleDeployed {
		// Pool addresses go back to their pools, except on subnets whose
		// release policy is keep (state.Store.ApplyReleasing).
		_, err := st.ApplyReleasing(state.Move{Server: step.Server, From: state.LifecycleDeployed, To: state.LifecycleReady, Reason: step.Why,
			Update: func(s *state.Server) error {
				s.WipeErase, s.WipeEraseDisks = s.Allocation.EraseMethod(), s.Allocation.EraseDiskMethods()
				s.Allocation, s.NeedsWipe = nil, true
				return nil
			},
			ForgetHosts: state.HostReleased, ForgetReason: "server " + step.Server + " released: " + step.Why}, plan.KeepAddresses(x.desired))
		if err != nil {
			return err
		}
		x.log.Info("released", "wipe", "next: the ramdisk's release wipe")
	}
	// Also outside the move: a release resumed after the move (the
	// journal) still forgets the host; a no-op when the move did.
	_, err := st.ForgetHostsOf(step.Server, state.HostReleased, "server "+step.Server+" released: "+step.Why)
	return err
}

// retire powers the server off (when it has a BMC), moves it to retired
// and forgets its joined host.
func (c *Controller) retire(ctx context.Context, x *stepCtx) error {
	st, step := c.cfg.Store, x.step
	if x.m != nil {
		if err := x.m.Power(ctx, bmc.PowerActionOff); err != nil {
			return err
		}
		_, _ = st.SetPower(step.Server, state.PowerOff, state.PowerSourceCommand)
	}
	if x.obs.Lifecycle != state.LifecycleRetired {
		// A retired server keeps no pool address, whatever the policy.
		_, err := st.ApplyReleasing(state.Move{Server: step.Server, From: x.obs.Lifecycle, To: state.LifecycleRetired, Reason: step.Why,
			Update:      func(s *state.Server) error { s.Allocation, s.WipeStartedAt = nil, time.Time{}; return nil },
			ForgetHosts: state.HostRetired, ForgetReason: "server " + step.Server + " retired: " + step.Why}, nil)
		if err != nil {
			return err
		}
		x.log.Info("retired")
	}
	_, err := st.ForgetHostsOf(step.Server, state.HostRetired, "server "+step.Server+" retired: "+step.Why)
	return err
}

// timeout ends a phase past its deadline: power off first so a machine
// stuck in the ramdisk stops (a BMC that cannot do it does not keep the
// server from failing), then a running release wipe is recorded as
// failed, and a commissioning or deploying server moves to failed.
func (c *Controller) timeout(ctx context.Context, x *stepCtx) error {
	if x.m != nil {
		if err := x.m.Power(ctx, bmc.PowerActionOff); err != nil {
			x.log.Warn("power off after deadline", "err", redact.String(err.Error()))
		} else {
			_, _ = c.cfg.Store.SetPower(x.step.Server, state.PowerOff, state.PowerSourceCommand)
		}
	}
	if x.obs.Lifecycle == state.LifecycleReady && x.obs.NeedsWipe {
		if err := c.wipeTimedOut(x); err != nil {
			return err
		}
	}
	if x.obs.Lifecycle == state.LifecycleCommissioning || x.obs.Lifecycle == state.LifecycleDeploying {
		why := x.step.Why
		_, err := c.cfg.Store.Apply(state.Move{Server: x.step.Server, From: x.obs.Lifecycle, To: state.LifecycleFailed, Reason: why,
			Update: func(s *state.Server) error { s.LastError = why; s.Allocation = nil; return nil }})
		if err != nil {
			return staleOK(err)
		}
		x.log.Info("failed", "reason", why)
	}
	return nil
}

// wipeTimedOut records a release wipe past its deadline as failed (the
// plan retries it after a backoff of its own: wipeRetryAt).
func (c *Controller) wipeTimedOut(x *stepCtx) error {
	st, why := c.cfg.Store, x.step.Why
	now := c.cfg.Now().UTC()
	_, err := st.UpdateServer(x.step.Server, func(s *state.Server) error {
		if !s.NeedsWipe || s.WipeStartedAt.IsZero() {
			return nil // reported meanwhile
		}
		s.WipeStartedAt, s.WipeFailedAt, s.LastError = time.Time{}, now, why
		s.WipeFailures++
		return nil
	})
	if err != nil {
		return err
	}
	_, _ = st.AppendEvent(state.Event{Server: x.step.Server, Kind: "wipe.failed", Message: why})
	x.log.Warn("release wipe failed", "reason", why)
	return nil
}

// leaseList renders a server's pool addresses for a log line, e.g.
// "eno1=10.20.0.101 (mgmt)".
func leaseList(ls []state.AddressLease) string {
	out := make([]string, len(ls))
	for i, l := range ls {
		out[i] = l.Interface + "=" + l.Address + " (" + l.Subnet + ")"
	}
	return strings.Join(out, ", ")
}
