package gitops

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sort"
	"strings"
	"time"

	"github.com/machina-metal/machina/discover"
	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/reconciler/plan"
	"github.com/machina-metal/machina/redact"
	"github.com/machina-metal/machina/state"
)

// TPMPinConfig configures a [TPMPinner].
type TPMPinConfig struct {
	// Store holds the servers' attested EKs (state.Server.TPM). Required.
	Store *state.Store
	// Desired is the current inventory; nil or a nil result proposes
	// nothing (the pins already in servers.yaml are not known yet).
	Desired func() *inventory.Inventory
	// Proposer pushes the review branch. Required.
	Proposer *Proposer
	// Interval is how often pending pins are looked for; zero means a
	// minute.
	Interval time.Duration
	// Logger: nil discards.
	Logger *slog.Logger
}

// TPMPinner proposes servers.yaml tpm.ek pins: for every server whose TPM
// attested (its EK recorded in the store) and whose servers.yaml entry
// pins no EK, one commit on a review branch (tpm/DATE) sets tpm: {ek: ...}.
// Once a reviewer merges it, a machine with another TPM is refused for
// that server. A server is proposed once per EK.
type TPMPinner struct {
	cfg TPMPinConfig
	log *slog.Logger
}

// NewTPMPinner checks cfg.
func NewTPMPinner(cfg TPMPinConfig) (*TPMPinner, error) {
	if cfg.Store == nil || cfg.Proposer == nil || cfg.Desired == nil {
		return nil, errors.New("gitops: TPMPinConfig needs Store, Proposer and Desired")
	}
	if cfg.Interval <= 0 {
		cfg.Interval = time.Minute
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &TPMPinner{cfg: cfg, log: cfg.Logger}, nil
}

// Run proposes pending pins every Interval (one store snapshot each,
// whatever the store's write rate) until ctx is done, then returns nil;
// it backs off after a failed proposal.
func (p *TPMPinner) Run(ctx context.Context) error {
	tick := time.NewTicker(p.cfg.Interval)
	defer tick.Stop()
	var notBefore time.Time
	failures := 0
	for {
		if time.Now().After(notBefore) {
			if _, err := p.ProposePending(ctx); err != nil && ctx.Err() == nil {
				failures++
				d := plan.Backoff(time.Minute, time.Hour, failures, rand.Float64())
				notBefore = time.Now().Add(d)
				p.log.Warn("TPM pin proposal failed; will retry", "err", redact.String(err.Error()), "in", d.Round(time.Second))
			} else {
				failures = 0
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// ProposePending proposes, in one commit, the tpm.ek pin of every server
// with an attested EK that servers.yaml does not pin and that was not
// proposed for that EK yet, and records the branch on each. It returns
// how many it proposed.
func (p *TPMPinner) ProposePending(ctx context.Context) (int, error) {
	inv := p.cfg.Desired()
	if inv == nil {
		return 0, nil
	}
	snap, err := p.cfg.Store.Snapshot()
	if err != nil {
		return 0, fmt.Errorf("tpm pin proposal: %w", err)
	}
	pins := map[string]string{} // server -> EK
	for _, s := range snap.Servers {
		in := inv.Server(s.Name)
		if s.TPM == nil || s.TPM.EK == "" || s.TPM.Proposed == s.TPM.EK || in == nil || in.TPM != nil {
			continue
		}
		pins[s.Name] = s.TPM.EK
	}
	if len(pins) == 0 {
		return 0, nil
	}
	names := make([]string, 0, len(pins))
	for n := range pins {
		names = append(names, n)
	}
	sort.Strings(names)
	var added []string
	edit := func(servers []byte, base *inventory.Inventory) ([]byte, error) {
		added = added[:0]
		out := servers
		for _, n := range names {
			if s := base.Server(n); s == nil || s.TPM != nil {
				continue // removed, or pinned meanwhile
			}
			next, err := discover.SetTPM(out, n, pins[n])
			if err != nil {
				return nil, err
			}
			out = next
			added = append(added, n)
		}
		if len(added) == 0 {
			return nil, nil
		}
		return out, nil
	}
	msg := fmt.Sprintf("servers.yaml: pin the TPM EK of %s\n\nEach EK is the one the server's TPM 2.0 attested with (credential activation and a\nverified quote). Once merged, a machine with another TPM is refused for that server.\n", strings.Join(names, ", "))
	prop, err := p.cfg.Proposer.Propose(ctx, msg, edit)
	if errors.Is(err, ErrNothingToPropose) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("tpm pin proposal: %w", err)
	}
	for _, n := range added {
		ek := pins[n]
		if _, err := p.cfg.Store.UpdateServer(n, func(s *state.Server) error {
			if s.TPM != nil && s.TPM.EK == ek {
				s.TPM.Proposed, s.TPM.ProposalBranch = ek, prop.Branch
			}
			return nil
		}); err != nil {
			p.log.Error("record TPM pin proposal", "machine", n, "err", err)
			continue
		}
		_, _ = p.cfg.Store.AppendEvent(state.Event{Server: n, Kind: "tpm.pin_proposed", Actor: state.ActorController,
			Message: fmt.Sprintf("servers.yaml tpm.ek %s proposed on branch %s (commit %.12s): review and merge it", ek, prop.Branch, prop.Commit)})
	}
	p.log.Info("TPM pins proposed", "branch", prop.Branch, "servers", strings.Join(added, ","))
	return len(added), nil
}
