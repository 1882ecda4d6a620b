package plan

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/machina-metal/machina/state"
)

// FailingAfter is the count of consecutive failures (state.Server.Failures)
// from which a server's retried action shows as a Failing condition: the
// first failure may be a blip the first retry absorbs; the second in a row
// is not.
const FailingAfter = 2

// Condition types and reasons of actions that keep failing and of the
// steps that wait behind them.
const (
	// CondFailing is the type of the condition of a server whose action
	// failed FailingAfter times or more in a row and is retried with
	// backoff (reason ActionFailing).
	CondFailing = "Failing"
	// ReasonActionFailing is CondFailing's reason.
	ReasonActionFailing = "ActionFailing"
	// ReasonBehindAction is the reason of the Waiting condition of a step
	// the executor does not start because another action of the same
	// server is in flight (journalled) or in its retry backoff.
	ReasonBehindAction = "BehindAction"
)

// failingAction names the action a server's failures are about: the
// journalled one, else the action LastError starts with (the executor
// writes "ACTION: error"), else "".
func failingAction(obs *state.Server) string {
	if obs.InFlight != nil {
		return obs.InFlight.Action
	}
	if a, _, ok := strings.Cut(obs.LastError, ": "); ok {
		if _, known := actionInfo[Action(a)]; known {
			return a
		}
	}
	return ""
}

// failingConditions reports, per server of have in name order, a Failing
// condition when its action has failed FailingAfter times or more in a
// row and is retried (a stalled server has its own condition: it is not
// retried), and a Waiting condition (ReasonBehindAction) for each planned
// step that waits behind an action in flight or in backoff: the executor
// runs one step per server, the journalled action first (see the
// executor's firstSteps), and none before the retry time. names are
// have's server names, sorted.
func failingConditions(have state.Snapshot, names []string, steps []Step, opts Options) []Condition {
	var out []Condition
	// Most records are neither failing nor busy: these fields are read
	// through the map, and only the others are copied, and only their
	// steps are grouped (a fleet of new servers plans thousands of steps
	// a pass; tens of servers are busy).
	var busy []string
	for _, name := range names {
		if have.Servers[name].Stalled != "" || (have.Servers[name].Failures == 0 && have.Servers[name].InFlight == nil) {
			continue
		}
		busy = append(busy, name)
	}
	if len(busy) == 0 {
		return nil
	}
	byServer := make(map[string][]Step, len(busy))
	for _, name := range busy {
		byServer[name] = nil
	}
	for _, s := range steps {
		if st, ok := byServer[s.Server]; ok {
			byServer[s.Server] = append(st, s)
		}
	}
	for _, name := range busy {
		obs := have.Servers[name]
		action := failingAction(obs)
		retry := ""
		if opts.Now.Before(obs.RetryAt) {
			retry = "next retry at " + obs.RetryAt.UTC().Format(time.RFC3339)
		} else if obs.Failures > 0 {
			retry = "retry due now"
		}
		if obs.Failures >= FailingAfter {
			what := action
			if what == "" {
				what = "an action"
			}
			out = append(out, Condition{Subject: "server/" + name, Type: CondFailing, Reason: ReasonActionFailing,
				Message: fmt.Sprintf("%s failed %d times in a row; %s; last error: %s", what, obs.Failures, retry, obs.LastError)})
		}
		var blocker string
		switch {
		case obs.InFlight != nil:
			blocker = obs.InFlight.Action + " in flight"
			if obs.Failures > 0 {
				blocker = fmt.Sprintf("%s, failing (%d in a row; %s)", blocker, obs.Failures, retry)
			}
		case obs.Failures > 0 && opts.Now.Before(obs.RetryAt):
			blocker = fmt.Sprintf("the retry time of %s after %d failures in a row (%s)", orAnAction(action), obs.Failures, retry)
		default:
			continue
		}
		var waiting []string
		for _, s := range byServer[name] {
			if obs.InFlight != nil && string(s.Action) == obs.InFlight.Action {
				continue
			}
			if !slices.Contains(waiting, string(s.Action)) {
				waiting = append(waiting, string(s.Action))
			}
		}
		if len(waiting) == 0 {
			continue
		}
		out = append(out, Condition{Subject: "server/" + name, Type: "Waiting", Reason: ReasonBehindAction,
			Message: fmt.Sprintf("%s waits for %s", strings.Join(waiting, ", "), blocker)})
	}
	return out
}

func orAnAction(a string) string {
	if a == "" {
		return "an action"
	}
	return a
}
