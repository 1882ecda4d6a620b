package node

import (
	"context"
	"errors"
	"fmt"
	"time"

	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/vishvananda/netlink"
)

// DefaultReachWithin bounds how long after a network change the controller
// must answer before the change is rolled back: longer than a Linux
// bridge's default forwarding delay with STP off (none) and a switch's
// MAC relearning, shorter than the controller's lost-host timeout.
const DefaultReachWithin = 20 * time.Second

// ErrCutOff is wrapped by ApplyGuarded when the controller did not answer
// within the bound after the change, and the change was rolled back.
var ErrCutOff = errors.New("controller unreachable after the network change")

// ErrUnreachableBefore is wrapped by ApplyGuarded when the controller did
// not answer before any change: the change could not be checked, so it was
// not made.
var ErrUnreachableBefore = errors.New("controller unreachable before the network change")

// Guard says how ApplyGuarded checks the management path.
type Guard struct {
	// Reach makes one bounded round trip to the controller over the
	// management path (machina-node: a heartbeat over mutual TLS); nil
	// skips the check, so only a failed change is rolled back.
	Reach func(ctx context.Context) error
	// Within bounds how long Reach may keep failing after the change;
	// zero means DefaultReachWithin.
	Within time.Duration
	// Every paces Reach's attempts; zero means 500 ms.
	Every time.Duration
}

// ApplyGuarded changes the running host's network with change, safely:
// it checks the controller answers (Reach) before anything changes, takes a
// Checkpoint through h (nil: the current namespace), runs change, flushes
// the learnt ARP and NDP entries (a check must not pass on next hops the
// change broke: those fail only when they expire, tens of seconds later)
// and checks Reach again for up to Within; when change fails or the controller
// does not answer in time, it rolls the host back to the checkpoint by
// itself (as `netplan try` and nmstate checkpoints do) and checks Reach
// once more. The error wraps ErrCutOff (rolled back because unreachable),
// ErrUnreachableBefore (nothing changed), or change's own error (rolled
// back), and says whether the controller answered after the rollback.
// The checkpoint lives in memory: if this process dies mid-change the
// host keeps the change until the next boot applies its persistent
// configuration.
func ApplyGuarded(ctx context.Context, h *netlink.Handle, g Guard, change func() error) error {
	if g.Reach != nil {
		if err := reachWithin(ctx, g, g.Within); err != nil {
			return fmt.Errorf("%w: %v; nothing changed", ErrUnreachableBefore, err)
		}
	}
	cp, err := TakeCheckpoint(h)
	if err != nil {
		return err
	}
	t0 := time.Now()
	cerr := change()
	if cerr == nil && g.Reach != nil {
		// The check must not pass on cached next hops the change broke.
		if err := flushNeighbours(h); err != nil {
			cerr = err
		}
	}
	if cerr == nil && g.Reach != nil {
		if rerr := reachWithin(ctx, g, g.Within); rerr != nil {
			cerr = fmt.Errorf("%w: no answer within %v (%v)", ErrCutOff, cmpOr(g.Within, DefaultReachWithin), rerr)
		}
	}
	if cerr == nil {
		return nil
	}
	if rb := cp.Rollback(h); rb != nil {
		return fmt.Errorf("%w; rollback to the checkpoint failed: %v", cerr, rb)
	}
	after := "rolled back to the checkpoint"
	if g.Reach != nil {
		if rerr := reachWithin(ctx, g, g.Within); rerr != nil {
			after += fmt.Sprintf("; the controller still does not answer: %v", rerr)
		} else {
			after += fmt.Sprintf("; the controller answers again (%v after the change began)", time.Since(t0).Round(time.Millisecond))
		}
	}
	return fmt.Errorf("%w; %s", cerr, after)
}

// reachWithin calls g.Reach until it succeeds or within (zero:
// DefaultReachWithin) has passed, each attempt bounded by what is left.
func reachWithin(ctx context.Context, g Guard, within time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, cmpOr(within, DefaultReachWithin))
	defer cancel()
	every := cmpOr(g.Every, 500*time.Millisecond)
	for {
		err := g.Reach(ctx)
		if err == nil {
			return nil
		}
		t := time.NewTimer(every)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
	}
}

func cmpOr(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}

// applyNetworks applies every network of resp inside one ApplyGuarded
// change when there are networks, reporting each network's step after
// the guard's verdict (a step reported as applied must still be applied:
// the controller records it on the host). A network that fails is
// reported failed and the others still run; the whole change is rolled
// back only when the controller stops answering. On a rollback every
// network is reported failed with the reason. It returns the first error.
func applyNetworks(ctx context.Context, nets []v1.JoinNetwork, h *netlink.Handle, g Guard, report func(v1.JoinStep)) error {
	if len(nets) == 0 {
		return nil
	}
	type outcome struct {
		msg string
		err error
	}
	outs := make([]outcome, len(nets))
	gerr := ApplyGuarded(ctx, h, g, func() error {
		for i, n := range nets {
			outs[i].msg, outs[i].err = ApplyNetwork(h, n)
		}
		return nil
	})
	var first error
	for i, n := range nets {
		name := "network " + n.Name
		switch {
		case gerr != nil:
			msg := gerr.Error()
			if outs[i].msg != "" {
				msg = outs[i].msg + "; then " + msg
			}
			report(v1.JoinStep{Step: name, OK: false, Message: msg})
			if first == nil {
				first = fmt.Errorf("%s: %w", name, gerr)
			}
		case outs[i].err != nil:
			report(v1.JoinStep{Step: name, OK: false, Message: outs[i].err.Error()})
			if first == nil {
				first = fmt.Errorf("%s: %w", name, outs[i].err)
			}
		default:
			report(v1.JoinStep{Step: name, OK: true, Message: outs[i].msg})
		}
	}
	return first
}
