package controller

import (
	"context"
	"fmt"
	"time"

	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/join"
	"github.com/machina-metal/machina/state"
)

// joinCommander issues a single-use enrolment token for each deploy and
// renders the first-boot join command that pins the join listener's CA and
// install script, for the NoCloud seed.
type joinCommander struct {
	srv     *join.Server
	desired func() *inventory.Inventory
	ttl     time.Duration
}

// JoinCommand implements JoinCommander: the token-file variant
// (join.FirstBootCommandFromFile reading v1.JoinTokenPath), so the token
// is never in the host's argv or cloud-init's logs.
func (j joinCommander) JoinCommand(_ context.Context, srv state.Server, p inventory.Profile) (cmd, token string, err error) {
	inv := j.desired()
	if inv == nil {
		return "", "", fmt.Errorf("no valid inventory revision")
	}
	ws := inv.Server(srv.Name)
	if ws == nil {
		return "", "", fmt.Errorf("server %s is not in the inventory", srv.Name)
	}
	req := join.DeployEnrolment(p, *ws, j.ttl)
	if srv.Deploy != nil {
		req.Deploy = srv.Deploy.ID // joins only after this deploy's verified done
	}
	tok, err := j.srv.IssueToken(req, state.ActorController)
	if err != nil {
		return "", "", err
	}
	cmd, err = join.FirstBootCommandFromFile(tok.JoinURL, tok.CAFingerprint, tok.ScriptSHA256, v1.JoinTokenPath)
	if err != nil {
		return "", "", err
	}
	return cmd, tok.Token, nil
}
