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
func Apply(ctx context.Context, resp v1.JoinResponse, nl *netlink.Handle, r Runner, report func(v1.JoinStep)) v1.JoinDone {
	if r == nil {
		r = ExecRunner{}
	}
	if report == nil {
		report = func(v1.JoinStep) {}
	}
	done := v1.JoinDone{OK: true}
	step := func(name, msg string, err error) {
		if err != nil {
			report(v1.JoinStep{Step: name, OK: false, Message: err.Error()})
			if done.OK {
				done = v1.JoinDone{OK: false, Reason: fmt.Sprintf("%s: %v", name, err)}
			}
			return
		}
		report(v1.JoinStep{Step: name, OK: true, Message: msg})
	}
	for _, n := range resp.Networks {
		msg, err := ApplyNetwork(nl, n)
		step("network "+n.Name, msg, err)
	}
	for _, p := range resp.Pools {
		msg, err := ApplyPool(ctx, r, p)
		step("pool "+p.Name, msg, err)
	}
	return done
}
