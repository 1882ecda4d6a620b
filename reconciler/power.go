package reconciler

import (
	"context"
	"fmt"

	"github.com/machina-metal/machina/bmc"
	"github.com/machina-metal/machina/state"
)

// powerOn powers the server on (servers.yaml actions.powerOn).
func (c *Controller) powerOn(ctx context.Context, x *stepCtx) error {
	return c.powerStep(ctx, x, bmc.PowerActionOn)
}

// powerOff powers the server off (actions.powerOff).
func (c *Controller) powerOff(ctx context.Context, x *stepCtx) error {
	return c.powerStep(ctx, x, bmc.PowerActionOff)
}

// powerCycle power-cycles the server (actions.powerCycle).
func (c *Controller) powerCycle(ctx context.Context, x *stepCtx) error {
	return c.powerStep(ctx, x, bmc.PowerActionCycle)
}

// powerStep performs a and records the power it leaves the server in. A
// reset or cycle goes through Machine.Restart: at most once per journal
// entry, read back from the BMC when the entry is resumed.
func (c *Controller) powerStep(ctx context.Context, x *stepCtx, a bmc.PowerAction) error {
	do := x.m.Power
	if a == bmc.PowerActionCycle || a == bmc.PowerActionReset {
		do = x.m.Restart
	}
	if err := do(ctx, a); err != nil {
		return err
	}
	p := state.PowerOn
	if a == bmc.PowerActionOff {
		p = state.PowerOff
	}
	_, _ = c.cfg.Store.SetPower(x.step.Server, p, state.PowerSourceCommand)
	x.log.Info("power", "action", string(a))
	return nil
}

// confirmOff checks through the BMC that a machine the ramdisk said it
// powers off is off (plan.ActConfirmOff), and powers it off when it is
// not: a guest or a real kernel can hang after the agent's final
// poweroff (the VM lab saw a soft lockup in virtio_net), and the server
// would stay on while the store said off. It decides from its own BMC
// read, made now: what the BMC sweep read since the claim (on, within the
// minute a hung kernel still draws power) settles nothing. Either way the
// power is then recorded as read from the BMC, which ends the claim and
// the step.
func (c *Controller) confirmOff(ctx context.Context, x *stepCtx) error {
	// Only a power command since the plan (a netboot, actions.powerOn)
	// settles the claim before this read: then there is nothing to
	// confirm.
	if cur, err := c.cfg.Store.Server(x.step.Server); err != nil {
		return err
	} else if _, pending := cur.Power.OffClaimPending(); !pending {
		return nil
	}
	ps, err := x.m.PowerState(ctx)
	if err != nil {
		return err
	}
	if ps != bmc.PowerOff {
		msg := fmt.Sprintf("the ramdisk said it powers the machine off, the BMC reads %s: powering it off", ps)
		x.log.Warn("machine did not power itself off", "power", string(ps))
		_, _ = c.cfg.Store.AppendEvent(state.Event{Server: x.step.Server, Kind: "power.forced_off", Actor: state.ActorController, Message: msg})
		if err := x.m.Power(ctx, bmc.PowerActionOff); err != nil {
			return err
		}
	}
	_, err = c.cfg.Store.SetPower(x.step.Server, state.PowerOff, state.PowerSourceBMC)
	return err
}
