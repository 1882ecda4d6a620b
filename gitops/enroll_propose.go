package gitops

import (
	"context"
	"errors"
	"fmt"
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

// Run proposes the servers.yaml entries of auto-enrolled servers whose
// commissioning ended (ready or failed), until ctx is done; it returns nil
// then. It wakes on store changes (after ProposeDelay, to batch) and every
// minute, and backs off after a failed proposal. Without a Proposer it only
// waits for ctx.
func (e *Enroller) Run(ctx context.Context) error {
	if e.cfg.Proposer == nil {
		<-ctx.Done()
		return nil
	}
	notify, stop := e.cfg.Store.Notify()
	defer stop()
	tick := time.NewTicker(time.Minute)
	defer tick.Stop()
	var notBefore time.Time
	failures := 0
	for {
		var retry <-chan time.Time
		if wait := time.Until(notBefore); wait > 0 {
			retry = time.After(wait)
		} else {
			_, err := e.ProposePending(ctx)
			switch {
			case err == nil:
				failures = 0
			case ctx.Err() != nil:
				return nil
			default:
				failures++
				d := plan.Backoff(e.cfg.RetryBase, e.cfg.RetryCap, failures, rand.Float64())
				notBefore = time.Now().Add(d)
				e.log.Warn("auto-enrol proposal failed; will retry", "err", redact.String(err.Error()), "in", d.Round(time.Second))
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		case <-retry:
		case <-notify:
			// Let the machines commissioning together finish, then
			// propose them in one commit.
			t := time.NewTimer(e.cfg.ProposeDelay)
			select {
			case <-ctx.Done():
				t.Stop()
				return nil
			case <-t.C:
			}
			select {
			case <-notify:
			default:
			}
		}
	}
}

// ProposePending proposes, in one commit, the entries of every
// auto-enrolled server that finished commissioning (ready or failed), is
// not proposed yet and is not in servers.yaml, and records the branch and
// commit on each (state.Enrolment). It returns how many it proposed; zero
// with a nil error when there is nothing to do. On failure it records the
// error on each server (shown in status) and returns it.
func (e *Enroller) ProposePending(ctx context.Context) (int, error) {
	if e.cfg.Proposer == nil {
		return 0, nil
	}
	cands, err := e.proposable()
	if err != nil {
		return 0, err
	}
	if len(cands) == 0 {
		return 0, nil
	}
	sort.Slice(cands, func(i, j int) bool { return cands[i].Name < cands[j].Name })
	var added []string
	edit := func(servers []byte, inv *inventory.Inventory) ([]byte, error) {
		inBase := map[string]bool{}
		for _, s := range inv.Servers {
			inBase[s.Name], inBase[s.BootMAC] = true, true
		}
		var es []discover.Entry
		added = added[:0]
		for _, s := range cands {
			if inBase[s.Name] || inBase[s.BootMAC] {
				continue // merged meanwhile, or added by hand
			}
			es = append(es, proposedEntry(s))
			added = append(added, s.Name)
		}
		if len(es) == 0 {
			return nil, nil
		}
		return discover.AppendEntries(servers, es)
	}
	prop, err := e.cfg.Proposer.Propose(ctx, proposalMessage(cands), edit)
	if errors.Is(err, ErrNothingToPropose) {
		return 0, nil
	}
	if err != nil {
		msg := redact.String(err.Error())
		for _, s := range cands {
			_, _ = e.cfg.Store.UpdateServer(s.Name, func(srv *state.Server) error {
				if srv.Enrolled != nil {
					srv.Enrolled.ProposalError = msg
				}
				return nil
			})
		}
		return 0, fmt.Errorf("auto-enrol proposal: %w", err)
	}
	now := e.cfg.Now().UTC()
	for _, name := range added {
		_, uerr := e.cfg.Store.UpdateServer(name, func(srv *state.Server) error {
			if srv.Enrolled != nil {
				srv.Enrolled.Branch, srv.Enrolled.Commit, srv.Enrolled.ProposedAt, srv.Enrolled.ProposalError = prop.Branch, prop.Commit, now, ""
			}
			return nil
		})
		if uerr != nil {
			e.log.Error("record proposal", "machine", name, "err", uerr)
			continue
		}
		_, _ = e.cfg.Store.AppendEvent(state.Event{Server: name, Kind: "enrol.proposed", Actor: state.ActorController,
			Message: fmt.Sprintf("servers.yaml entry proposed on branch %s (commit %.12s): review and merge it", prop.Branch, prop.Commit)})
	}
	e.log.Info("auto-enrolled servers proposed", "branch", prop.Branch, "commit", prop.Commit[:12], "servers", strings.Join(added, ","))
	return len(added), nil
}

// proposable returns the auto-enrolled servers whose commissioning
// ended (ready or failed), not proposed yet and not in servers.yaml.
func (e *Enroller) proposable() ([]state.Server, error) {
	snap, err := e.cfg.Store.Snapshot()
	if err != nil {
		return nil, fmt.Errorf("auto-enrol proposal: %w", err)
	}
	names, macs := map[string]bool{}, map[string]bool{}
	if inv := e.cfg.Desired(); inv != nil {
		for _, s := range inv.Servers {
			names[s.Name], macs[s.BootMAC] = true, true
		}
	}
	var cands []state.Server
	for _, s := range snap.Servers {
		if s.Enrolled == nil || s.Enrolled.Branch != "" || names[s.Name] || macs[s.BootMAC] {
			continue
		}
		if s.Lifecycle == state.LifecycleReady || s.Lifecycle == state.LifecycleFailed {
			cands = append(cands, *s) // a copy of the shared record
		}
	}
	return cands, nil
}

// proposedEntry is the servers.yaml entry of an auto-enrolled server: its
// generated name, zone and boot MAC, the auto-enrolled tag, no bmc block,
// and the commissioning facts as comments for the reviewer.
func proposedEntry(s state.Server) discover.Entry {
	e := discover.Entry{Name: s.Name, Zone: s.Zone, Tags: []string{EnrolledTag}, BootMAC: s.BootMAC, BootMode: s.BootMode}
	status := string(s.Lifecycle)
	if s.Lifecycle == state.LifecycleFailed && s.LastError != "" {
		status += " (" + s.LastError + ")"
	}
	e.Comment = append(e.Comment, fmt.Sprintf("auto-enrolled %s via %s; commissioning: %s", s.Enrolled.At.UTC().Format(time.RFC3339), s.Enrolled.Source, status))
	if hw := s.Hardware; hw != nil {
		line := fmt.Sprintf("hardware: %s %s, serial %s, %d cores, %d GiB memory", orDash(hw.Vendor), orDash(hw.Product), orDash(hw.Serial), hw.Cores, hw.MemoryBytes>>30)
		var disks []string
		for _, d := range hw.Disks {
			disks = append(disks, fmt.Sprintf("%s %d GiB", d.Name, d.SizeBytes>>30))
		}
		if len(disks) > 0 {
			line += "; disks " + strings.Join(disks, ", ")
		}
		e.Comment = append(e.Comment, line)
	}
	e.Comment = append(e.Comment, "no bmc yet: machinactl server bmc-set "+s.Name+" --driver redfish|ipmi --address ... --credentials ...")
	return e
}

func proposalMessage(cands []state.Server) string {
	var b strings.Builder
	fmt.Fprintf(&b, "auto-enrolled: %d server(s) that PXE-booted with unknown MACs\n\n", len(cands))
	for _, s := range cands {
		fmt.Fprintf(&b, "%s  %s  %s\n", s.Name, s.BootMAC, s.Lifecycle)
	}
	b.WriteString("\nReview each entry (zone, name: a renamed entry is adopted by its boot MAC),\n" +
		"merge, then attach each BMC with\n" +
		"machinactl server bmc-set NAME --driver ... --address ... --credentials ...\n")
	return b.String()
}

func orDash(s string) string {
	if strings.TrimSpace(s) == "" {
		return "-"
	}
	return s
}
