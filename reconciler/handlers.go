package reconciler

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/machina-metal/machina/bmc"
	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/reconciler/plan"
	"github.com/machina-metal/machina/state"
)

// ErrUnknownAction: a step names an action this build has no row or
// handler for (say, a journal written by another version). It is refused
// before anything is journalled or a BMC opened, and stalls the server
// (it is not retried on every pass).
var ErrUnknownAction = errors.New("unknown action")

// stepCtx is what a handler works with: the step, the desired inventory
// and the server's entry in it, the record as journalled (BMC steps), the
// server's Machine (nil for store-only steps and servers without a BMC)
// and the step's logger.
type stepCtx struct {
	step    plan.Step
	desired *inventory.Inventory
	ws      *inventory.Server // nil when the server is not in desired
	obs     state.Server      // zero for store-only steps
	m       Machine
	// drv is the server's BMC driver under m, for the optional
	// capabilities (firmware); nil when m is.
	drv bmc.Driver
	log *slog.Logger
}

// handler carries out one action kind. It is idempotent: a step resumed
// from the journal after a restart or a failure simply runs again.
type handler func(c *Controller, ctx context.Context, x *stepCtx) error

// handlers has one entry per row of actionInfo (checked by
// TestEveryActionHasRowAndHandler). Handlers act; the plan decides.
var handlers = map[plan.Action]handler{
	plan.ActRegister:       (*Controller).register,
	plan.ActUpdateIdentity: (*Controller).updateIdentity,
	plan.ActAllocate:       (*Controller).allocate,
	plan.ActUnretire:       (*Controller).unretire,
	plan.ActAdopt:          (*Controller).adopt,
	plan.ActCommission:     (*Controller).commission,
	plan.ActDeploy:         (*Controller).deploy,
	plan.ActFirmware:       (*Controller).applyFirmware,
	plan.ActRenetboot:      (*Controller).renetboot,
	plan.ActFinishDeploy:   (*Controller).finishDeploy,
	plan.ActRestoreDisk:    (*Controller).restoreDisk,
	plan.ActRelease:        (*Controller).release,
	plan.ActWipe:           (*Controller).wipe,
	plan.ActRetire:         (*Controller).retire,
	plan.ActTimeout:        (*Controller).timeout,
	plan.ActPowerOn:        (*Controller).powerOn,
	plan.ActPowerOff:       (*Controller).powerOff,
	plan.ActPowerCycle:     (*Controller).powerCycle,
	plan.ActConfirmOff:     (*Controller).confirmOff,
}

// run performs one step: it looks the action's row and handler up first
// (an unknown action is refused with ErrUnknownAction before anything is
// journalled), runs a store-only step's handler as is, and for a BMC step
// journals it, opens the BMC (a server without one gets BMCIfPresent
// steps with no Machine, and ErrNoBMC for BMCRequired ones), runs the
// handler and clears the journal (done).
func (c *Controller) run(ctx context.Context, step plan.Step, desired *inventory.Inventory, log *slog.Logger) error {
	info, known := step.Action.Info()
	h := handlers[step.Action]
	if !known || h == nil {
		return fmt.Errorf("%w %q", ErrUnknownAction, step.Action)
	}
	x := &stepCtx{step: step, desired: desired, log: log}
	if desired != nil {
		x.ws = desired.Server(step.Server)
	}
	if info.BMC == plan.BMCNone {
		return h(c, ctx, x)
	}
	obs, err := c.journal(step)
	if err != nil {
		return err
	}
	x.obs = obs
	if x.m, err = c.openMachine(ctx, info, x); err != nil {
		return err
	}
	if err := h(c, ctx, x); err != nil {
		return err
	}
	return c.done(step)
}

// openMachine opens the BMC of x's server as a Machine; nil (and no
// error) for a server without a BMC on a BMCIfPresent step.
func (c *Controller) openMachine(ctx context.Context, info plan.ActionInfo, x *stepCtx) (Machine, error) {
	if x.obs.BMC.Driver == "" {
		// A server without a BMC (auto-enrolled, none attached yet) is
		// only ever given the steps that merely power off on the way.
		if info.BMC == plan.BMCRequired {
			return nil, fmt.Errorf("%s: %w", x.step.Action, ErrNoBMC)
		}
		x.log.Info("no BMC: skipping power off", "action", string(x.step.Action))
		return nil, nil
	}
	drv, err := c.cfg.Drivers.Driver(ctx, x.obs)
	if err != nil {
		return nil, fmt.Errorf("open BMC: %w", err)
	}
	x.drv = drv
	mode := bmc.BootModeUEFI
	if x.ws != nil && x.ws.BootMode == inventory.BootBIOS {
		mode = bmc.BootModeLegacy
	}
	if c.machines != nil {
		return c.machines(drv, x.obs, mode, x.log), nil
	}
	return c.machine(drv, x.obs, mode, x.secureBoot(), x.log), nil
}
