package node

import (
	"context"
	"fmt"

	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/vishvananda/netlink"
)

// Apply builds resp's networks, then its storage pools, calling report
// with each step's outcome (step "network NAME" or "pool NAME"), and
// returns the join's outcome: OK, or the first failure's reason. Later
// steps still run after a failure so the join log shows all of them. nl
// nil means the current network namespace; r nil means ExecRunner{}.
// The networks are applied as one ApplyGuarded change checked by g: when
// the controller stops answering they are all rolled back and reported
// failed with why (see applyNetworks); g's zero value checks nothing.
func Apply(ctx context.Context, resp v1.JoinResponse, nl *netlink.Handle, r Runner, g Guard, report func(v1.JoinStep)) v1.JoinDone {
	if r == nil {
		r = ExecRunner{}
	}
	if report == nil {
		report = func(v1.JoinStep) {}
	}
	done := v1.JoinDone{OK: true}
	fail := func(err error) {
		if done.OK {
			done = v1.JoinDone{OK: false, Reason: err.Error()}
		}
	}
	if err := applyNetworks(ctx, resp.Networks, nl, g, report); err != nil {
		fail(err)
	}
	for _, p := range resp.Pools {
		name := "pool " + p.Name
		msg, err := ApplyPool(ctx, r, p)
		if err != nil {
			report(v1.JoinStep{Step: name, OK: false, Message: err.Error()})
			fail(fmt.Errorf("%s: %v", name, err))
			continue
		}
		report(v1.JoinStep{Step: name, OK: true, Message: msg})
	}
	return done
}
