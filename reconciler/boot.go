package reconciler

import (
	"context"
	"errors"
	"time"

	"github.com/machina-metal/machina/state"
)

// errWipeStale: the server no longer waits for a release wipe.
var errWipeStale = errors.New("no release wipe pending")

// commission moves the server to commissioning (dropping an allocation)
// and netboots it into the ramdisk.
func (c *Controller) commission(ctx context.Context, x *stepCtx) error {
	return c.netbootInto(ctx, x, state.LifecycleCommissioning)
}

// deploy moves an allocated server to deploying and netboots it into the
// ramdisk, which fetches its plan.
func (c *Controller) deploy(ctx context.Context, x *stepCtx) error {
	return c.netbootInto(ctx, x, state.LifecycleDeploying)
}

// netbootInto moves the server to lifecycle to (unless it is there: a
// resumed step), clearing what a new boot makes stale, then netboots it
// and records it as powered on.
func (c *Controller) netbootInto(ctx context.Context, x *stepCtx, to state.Lifecycle) error {
	st, step, from := c.cfg.Store, x.step, x.obs.Lifecycle
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
		x.log.Info("lifecycle", "from", from, "to", to)
	}
	return c.netbootOn(ctx, x)
}

// netbootOn netboots x's machine and records it as powered on.
func (c *Controller) netbootOn(ctx context.Context, x *stepCtx) error {
	c.beforeNetboot(ctx, x)
	if err := x.m.Netboot(ctx); err != nil {
		return err
	}
	_, err := c.cfg.Store.SetPower(x.step.Server, state.PowerOn, state.PowerSourceCommand)
	return err
}

// beforeNetboot runs Config.BeforeNetboot for x's server.
func (c *Controller) beforeNetboot(ctx context.Context, x *stepCtx) {
	if c.cfg.BeforeNetboot != nil && x.obs.BootMAC != "" {
		c.cfg.BeforeNetboot(ctx, x.step.Server, x.obs.BootMAC)
	}
}

// renetboot boots a silent commissioning or deploying machine again
// (fresh tokens), counting it on the record.
func (c *Controller) renetboot(ctx context.Context, x *stepCtx) error {
	if x.obs.Lifecycle != state.LifecycleCommissioning && x.obs.Lifecycle != state.LifecycleDeploying {
		return nil // heard from meanwhile, or moved on
	}
	st, step := c.cfg.Store, x.step
	now := c.cfg.Now().UTC()
	if _, err := st.UpdateServer(step.Server, func(s *state.Server) error {
		s.Renetboots++
		s.RenetbootAt = now
		return nil
	}); err != nil {
		return err
	}
	_, _ = st.AppendEvent(state.Event{Server: step.Server, Kind: "machine.renetboot", Message: step.Why})
	x.log.Warn("machine silent: re-netbooting", "why", step.Why)
	return c.netbootOn(ctx, x)
}

// finishDeploy sets boot to disk (read back) once the ramdisk wrote the
// image, and clears FinishDeploy.
func (c *Controller) finishDeploy(ctx context.Context, x *stepCtx) error {
	return c.bootDiskStep(ctx, x, true)
}

// restoreDisk sets boot back to disk after the boot a persistent netboot
// override was for (read back), and says so in an event.
func (c *Controller) restoreDisk(ctx context.Context, x *stepCtx) error {
	if err := c.bootDiskStep(ctx, x, false); err != nil {
		return err
	}
	_, _ = c.cfg.Store.AppendEvent(state.Event{Server: x.step.Server, Kind: "boot.disk_restored", Actor: state.ActorController,
		Message: "the persistent network-boot override is replaced by disk (read back): " + x.step.Why})
	return nil
}

// bootDiskStep sets boot to disk and clears RestoreDisk (and, for
// finish, FinishDeploy) on the record.
func (c *Controller) bootDiskStep(ctx context.Context, x *stepCtx, finish bool) error {
	if err := x.m.BootDisk(ctx); err != nil {
		return err
	}
	if _, err := c.cfg.Store.UpdateServer(x.step.Server, func(s *state.Server) error {
		if finish {
			s.FinishDeploy = false
		}
		s.BMC.RestoreDisk = false
		return nil
	}); err != nil {
		return err
	}
	x.log.Info("boot override set to disk (read back)")
	return nil
}

// wipe netboots a released server into the ramdisk's wipe mode, marking
// the wipe as running first (a ramdisk that reports quickly then finds
// the record in the state it expects); a server no longer waiting for a
// wipe ends the step.
func (c *Controller) wipe(ctx context.Context, x *stepCtx) error {
	st, step := c.cfg.Store, x.step
	now := c.cfg.Now().UTC()
	if _, err := st.UpdateServer(step.Server, func(s *state.Server) error {
		if s.Lifecycle != state.LifecycleReady || !s.NeedsWipe {
			return errWipeStale
		}
		s.WipeStartedAt = now
		return nil
	}); err != nil {
		if errors.Is(err, errWipeStale) {
			return nil
		}
		return err
	}
	c.beforeNetboot(ctx, x)
	if err := x.m.Netboot(ctx); err != nil {
		_, _ = st.UpdateServer(step.Server, func(s *state.Server) error { s.WipeStartedAt = time.Time{}; return nil })
		return err
	}
	if _, err := st.SetPower(step.Server, state.PowerOn, state.PowerSourceCommand); err != nil {
		return err
	}
	x.log.Info("release wipe started", "why", step.Why)
	return nil
}
