package controller

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/machina-metal/machina/api"
	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/discover"
	"github.com/machina-metal/machina/gitops"
	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/state"
)

// scanFunc runs one scan; production passes discover.Scan (tests wrap it
// to reach loopback emulators, which no request can ask for).
type scanFunc func(ctx context.Context, cfg discover.Config) (*discover.Report, error)

// scanTimeout bounds one scan request.
const scanTimeout = 5 * time.Minute

// proposeFunc pushes an edit of servers.yaml to the inventory repository
// (gitops.Proposer.Propose): onto a new review branch, or with
// commitTo straight onto the inventory branch. Nil when the controller
// follows no repository.
type proposeFunc func(ctx context.Context, commitTo bool, message string, edit func(servers []byte, inv *inventory.Inventory) ([]byte, error)) (gitops.Proposal, error)

// scanResponse is POST /api/v1/scan's answer: the report, and with
// register what was proposed.
type scanResponse struct {
	*discover.Report
	Registered *discover.Registered `json:"registered,omitempty"`
}

// scanProposers returns the proposeFunc of a controller following repo,
// with its own clones under gitDir (scan/ and scan-commit/, apart from
// auto-enrol's), made on first use.
func scanProposers(repo gitops.Remote, gitDir string, log *slog.Logger) proposeFunc {
	var (
		mu    sync.Mutex
		props = map[bool]*gitops.Proposer{}
	)
	return func(ctx context.Context, commitTo bool, message string, edit func([]byte, *inventory.Inventory) ([]byte, error)) (gitops.Proposal, error) {
		mu.Lock()
		p := props[commitTo]
		if p == nil {
			cfg := gitops.ProposerConfig{Remote: repo, StateDir: filepath.Join(gitDir, "scan"), Logger: log}
			if commitTo {
				cfg.StateDir, cfg.CommitTo = filepath.Join(gitDir, "scan-commit"), repo.Branch
				if cfg.CommitTo == "" {
					cfg.CommitTo = "main"
				}
			}
			np, err := gitops.NewProposer(cfg)
			if err != nil {
				mu.Unlock()
				return gitops.Proposal{}, err
			}
			props[commitTo], p = np, np
		}
		mu.Unlock()
		return p.Propose(ctx, message, edit)
	}
}

// mountDiscovery adds POST /api/v1/scan (admin token, audited): scan a
// private IPv4 range for Redfish BMCs with named credentials read from the
// secret store here, so passwords never leave the controller. Answers 200
// with the discover.Report (Incomplete set when the scan ran into
// scanTimeout or the client went away), 400 for a refused range or
// credential list, 404 for an unknown credential name. With "register"
// the authenticated BMCs are proposed as servers.yaml entries through
// propose (discover.Propose against the branch's inventory: entries the
// inventory has by name, boot MAC or BMC address are skipped), and the
// answer's "registered" names the branch and commit; an edit the
// inventory's validation refuses pushes nothing and is a 422 with the
// validation errors. branch is the inventory branch (the only CommitTo
// allowed).
func mountDiscovery(srv *api.Server, st *state.Store, scan scanFunc, propose proposeFunc, branch string) error {
	return srv.HandleAdmin("POST /api/v1/scan", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req v1.ScanRequest
		if !decode(w, r, &req) {
			return
		}
		creds, herr := scanCredentials(st, req.Credentials)
		if herr != nil {
			writeErr(w, herr.status, herr.code, herr.msg)
			return
		}
		if branch == "" {
			branch = "main"
		}
		if msg := scanRequestError(req, branch, propose != nil); msg != "" {
			writeErr(w, http.StatusBadRequest, "bad_request", msg)
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), scanTimeout)
		defer cancel()
		rep, err := scan(ctx, discover.Config{CIDR: req.CIDR, Credentials: creds, LockoutThreshold: req.LockoutThreshold,
			Port: req.Port, InsecureTLS: req.InsecureTLS})
		if err != nil && rep == nil {
			writeErr(w, http.StatusBadRequest, "bad_request", err.Error())
			return
		}
		n := 0
		for _, res := range rep.Results {
			if res.Status == discover.StatusAuthenticated {
				n++
			}
		}
		msg := fmt.Sprintf("scan %s with %s: %d probed, %d answered, %d authenticated", rep.Range, strings.Join(req.Credentials, ","), rep.Probed, len(rep.Results), n)
		if rep.Incomplete != "" {
			msg += " (incomplete: " + rep.Incomplete + ")"
		}
		_, _ = st.AppendEvent(state.Event{Kind: "scan", Actor: api.Actor(r), Message: msg})
		out := scanResponse{Report: rep}
		if req.Register {
			reg, err := registerScan(ctx, rep, req, propose)
			var verr *inventory.ValidationError
			switch {
			case errors.As(err, &verr):
				writeErr(w, http.StatusUnprocessableEntity, "invalid_proposal", "register: the proposed servers.yaml is invalid: "+verr.Error())
				return
			case err != nil:
				writeErr(w, http.StatusBadGateway, "push_failed", "register: "+err.Error())
				return
			}
			out.Registered = reg
			if reg.Commit != "" {
				_, _ = st.AppendEvent(state.Event{Kind: "scan", Actor: api.Actor(r),
					Message: fmt.Sprintf("scan %s: %d server(s) proposed on %s (%s)", rep.Range, len(reg.Added), reg.Branch, reg.Commit[:12])})
			}
		}
		writeJSON(w, http.StatusOK, out)
	}))
}

// httpErr is an error answer: status, code and message.
type httpErr struct {
	status    int
	code, msg string
}

// scanCredentials reads the named credentials of a scan request from the
// secret store (1 to discover.MaxCredentials of them).
func scanCredentials(st *state.Store, names []string) ([]discover.Credential, *httpErr) {
	if len(names) == 0 || len(names) > discover.MaxCredentials {
		return nil, &httpErr{http.StatusBadRequest, "bad_request", fmt.Sprintf("give 1 to %d credential names", discover.MaxCredentials)}
	}
	creds := make([]discover.Credential, 0, len(names))
	for _, name := range names {
		c, err := st.Secret(name)
		if errors.Is(err, state.ErrNotFound) || errors.Is(err, state.ErrInvalid) {
			return nil, &httpErr{http.StatusNotFound, "not_found", fmt.Sprintf("credential %q is not in the secret store", name)}
		}
		if err != nil {
			return nil, &httpErr{http.StatusInternalServerError, "internal", "read credential " + name}
		}
		creds = append(creds, discover.Credential{Name: name, Username: c.Username, Password: c.Password})
	}
	return creds, nil
}

// scanRequestError says what is wrong with a scan request's port and
// register options ("" when nothing): canPropose is false when the
// controller follows no inventory repository.
func scanRequestError(req v1.ScanRequest, branch string, canPropose bool) string {
	switch {
	case req.Port < 0 || req.Port > 65535:
		return "port out of range"
	case !req.Register && (req.Zone != "" || req.Site != "" || req.CommitTo != ""):
		return "zone, site and commitTo only go with register"
	case req.Register && req.Zone == "":
		return "register needs zone: the zone of the proposed servers"
	case req.Register && !canPropose:
		return "register: this controller follows no inventory repository (machina serve --repo)"
	case req.CommitTo != "" && req.CommitTo != branch:
		return fmt.Sprintf("commitTo %q: only the inventory branch %q can be committed to directly", req.CommitTo, branch)
	}
	return ""
}

// registerScan proposes rep's authenticated BMCs through propose, the
// entries worked out against the inventory of the branch tip the
// proposal starts from. Nothing to add commits nothing (no Branch).
func registerScan(ctx context.Context, rep *discover.Report, req v1.ScanRequest, propose proposeFunc) (*discover.Registered, error) {
	reg := &discover.Registered{Added: []discover.Entry{}, Skipped: []discover.Skip{}}
	edit := func(servers []byte, inv *inventory.Inventory) ([]byte, error) {
		es, skips := discover.Propose(rep, inv, req.Zone, req.Site)
		reg.Added, reg.Skipped = append([]discover.Entry{}, es...), append([]discover.Skip{}, skips...)
		if len(es) == 0 {
			return servers, nil
		}
		return discover.AppendEntries(servers, es)
	}
	// The message is written before the edit runs; it names the range,
	// and the commit's diff names the servers.
	msg := fmt.Sprintf("discovered: servers from a BMC scan of %s (POST /api/v1/scan)\n", rep.Range)
	prop, err := propose(ctx, req.CommitTo != "", msg, edit)
	if errors.Is(err, gitops.ErrNothingToPropose) {
		return reg, nil
	}
	if err != nil {
		return nil, err
	}
	reg.Branch, reg.Commit = prop.Branch, prop.Commit
	return reg, nil
}
