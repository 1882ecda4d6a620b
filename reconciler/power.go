package reconciler

import (
	"context"

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
