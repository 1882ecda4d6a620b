package reconciler

import (
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/machina-metal/machina/bmc"
	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/reconciler/plan"
	"github.com/machina-metal/machina/redact"
	"github.com/machina-metal/machina/state"
)

// stalls reports whether a failed step needs a human rather than a
// retry: a non-transient failure of a disruptive action, a refused
// credential, something the BMC does not support, no BMC, or an action
// this build does not know.
func stalls(step plan.Step, err error) bool {
	return !bmc.IsTransient(err) && (step.Action.Disruptive() || errors.Is(err, bmc.ErrAuth) || errors.Is(err, bmc.ErrUnsupported) ||
		errors.Is(err, ErrNoBMC) || errors.Is(err, ErrUnknownAction))
}

// recordFailure is the one writer of a failed step's outcome (metal3's
// recordActionFailure): in one transaction on the server's record, the
// error (LastError), the stall key when it stalls, the consecutive
// failure count and the retry time after Backoff, and the
// action.failed or action.stalled event. A stalled server keeps its
// journal (InFlight): the action resumes when the stall is cleared. A
// server whose record is gone records nothing.
func (c *Controller) recordFailure(step plan.Step, desired *inventory.Inventory, err error, log *slog.Logger) {
	stall := stalls(step, err)
	msg := redact.String(err.Error())
	if stall {
		log.Error("action failed; stalled until the desired state or counter changes", "err", msg)
	} else {
		log.Warn("action failed; will retry with backoff", "err", msg)
	}
	now := c.cfg.Now()
	_, _, uerr := c.cfg.Store.UpdateServerWithEvent(step.Server, func(s *state.Server) (state.Event, error) {
		s.LastError = fmt.Sprintf("%s: %s", step.Action, msg)
		kind := "action.failed"
		if stall {
			s.Stalled, kind = stepKey(step, desired), "action.stalled"
		}
		s.Failures++
		s.RetryAt = now.Add(plan.Backoff(c.cfg.BackoffBase, c.cfg.BackoffCap, s.Failures, rand.Float64())).UTC()
		return state.Event{Kind: state.EventKind(kind), Message: s.LastError}, nil
	})
	if uerr != nil && !errors.Is(uerr, state.ErrNotFound) {
		log.Error("record the failure", "err", uerr)
	}
}

// clearBackoff ends a server's backoff after a step that succeeded. A BMC
// step's done has cleared it already; a store-only step clears it here,
// only when there is one to clear.
func (c *Controller) clearBackoff(step plan.Step, obs state.Server, log *slog.Logger) {
	if obs.Failures == 0 && obs.RetryAt.IsZero() {
		return
	}
	if info, _ := step.Action.Info(); info.BMC != plan.BMCNone {
		return
	}
	_, err := c.cfg.Store.UpdateServer(step.Server, func(s *state.Server) error {
		s.Failures, s.RetryAt = 0, time.Time{}
		return nil
	})
	if err != nil && !errors.Is(err, state.ErrNotFound) {
		log.Warn("clear the backoff", "err", err)
	}
}
