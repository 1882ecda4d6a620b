package reconciler

import (
	"context"

	"github.com/machina-metal/machina/inventory"
)

// Revisions is all the executor knows of the Git source of desired
// state (gitops.Source implements it): the newest good revision's
// inventory and digest (nil and "" before the first), whether the newest
// revision is invalid, and a channel that receives when either changes.
type Revisions interface {
	DesiredRevision() (inv *inventory.Inventory, digest string, invalid bool)
	Changed() <-chan struct{}
}

// Follow applies revs to c until ctx is done. While the newest revision
// is invalid, deploys are held (SetHoldDeploys) and the last good one
// stays desired; each new good revision (another digest) becomes desired
// (SetDesired), and then onNew, when not nil, is called with it (the
// controller starts its image imports there).
func (c *Controller) Follow(ctx context.Context, revs Revisions, onNew func(*inventory.Inventory)) {
	var last string
	for {
		inv, digest, invalid := revs.DesiredRevision()
		c.SetHoldDeploys(invalid)
		if inv != nil && digest != last {
			last = digest
			c.SetDesired(inv)
			if onNew != nil {
				onNew(inv)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-revs.Changed():
		}
	}
}
