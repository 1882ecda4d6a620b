package reconciler

import (
	"errors"
	"fmt"
	"time"

	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/state"
)

// journal records step as in flight and returns the server record.
func (c *Controller) journal(step Step) (state.Server, error) {
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
func (c *Controller) done(step Step) error {
	counter := actionInfo[step.Action].Counter
	_, err := c.cfg.Store.UpdateServer(step.Server, func(s *state.Server) error {
		s.InFlight, s.Stalled = nil, ""
		s.Failures, s.RetryAt = 0, time.Time{}
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
