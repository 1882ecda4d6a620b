package reconciler

import (
	"errors"
	"fmt"
	"time"

	"github.com/machina-metal/machina/reconciler/plan"
	"github.com/machina-metal/machina/state"
)

// journal records step as in flight and returns the server record.
func (c *Controller) journal(step plan.Step) (state.Server, error) {
	return c.cfg.Store.UpdateServer(step.Server, func(s *state.Server) error {
		attempt := 1
		if s.InFlight != nil && s.InFlight.Action == string(step.Action) {
			attempt = s.InFlight.Attempt + 1
		}
		key := fmt.Sprintf("%s/%d", step.Action, step.Counter)
		var sent, mark time.Time
		if s.InFlight != nil && s.InFlight.Key == key {
			// Resumed: the BMC may have acted already.
			sent, mark = s.InFlight.PowerSent, s.InFlight.ResetMark
		}
		s.InFlight = &state.InFlight{Action: string(step.Action), Key: key, Started: c.cfg.Now().UTC(), Attempt: attempt, Counter: step.Counter,
			PowerSent: sent, ResetMark: mark}
		return nil
	})
}

// done clears the journal and records the action counter as observed.
func (c *Controller) done(step plan.Step) error {
	counter := info(step.Action).Counter
	_, err := c.cfg.Store.UpdateServer(step.Server, func(s *state.Server) error {
		s.InFlight, s.Stalled = nil, ""
		s.Failures, s.RetryAt = 0, time.Time{}
		if step.Action != plan.ActTimeout {
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

// staleOK turns a stale transition (someone else already moved the server)
// into success: the plan is recomputed from the new state next pass.
func staleOK(err error) error {
	if errors.Is(err, state.ErrStaleTransition) {
		return nil
	}
	return err
}

// info is a's row of the plan's action table; the zero row (BMCNone,
// limited, no counter) for an action this build does not know, which run
// refuses before anything reads the row.
func info(a plan.Action) plan.ActionInfo {
	i, _ := a.Info()
	return i
}
