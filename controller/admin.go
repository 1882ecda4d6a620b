package controller

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strings"

	"github.com/machina-metal/machina/api"
	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/discover"
	"github.com/machina-metal/machina/gitops"
	"github.com/machina-metal/machina/reconciler"
	"github.com/machina-metal/machina/reconciler/plan"
	"github.com/machina-metal/machina/state"
)

// mountAdmin adds the reconciler's admin routes, each behind an admin
// token and audited by the store's events:
//
//	POST /api/v1/reconcile   poll Git and plan now
//	GET  /api/v1/plan        the latest plan (steps, held steps, conditions)
//	GET  /api/v1/inventory   the acting and the newest invalid revision
//	POST /api/v1/approve     approve the held plan of a revision
//	POST /api/v1/provision   allocate and deploy N servers of a profile
//	POST /api/v1/scan        scan a BMC subnet (mountDiscovery; scan nil means discover.Scan)
func mountAdmin(srv *api.Server, st *state.Store, ctrl *reconciler.Controller, src *gitops.Source, scan scanFunc, propose proposeFunc, branch string) error {
	routes := map[string]http.HandlerFunc{
		"POST /api/v1/reconcile": func(w http.ResponseWriter, r *http.Request) {
			src.Trigger()
			ctrl.Trigger()
			writeJSON(w, http.StatusAccepted, reconcileAccepted{Status: "reconcile requested"})
		},
		"GET /api/v1/plan": func(w http.ResponseWriter, r *http.Request) {
			writeJSON(w, http.StatusOK, ctrl.LastPlan())
		},
		"GET /api/v1/inventory": func(w http.ResponseWriter, r *http.Request) {
			writeJSON(w, http.StatusOK, src.InventoryStatus().WithPlan(ctrl.LastPlan()))
		},
		"POST /api/v1/approve":   approveHandler(st, ctrl, src),
		"POST /api/v1/provision": provisionHandler(st, ctrl),
	}
	for pattern, h := range routes {
		if err := srv.HandleAdmin(pattern, h); err != nil {
			return err
		}
	}
	if scan == nil {
		scan = discover.Scan
	}
	return mountDiscovery(srv, st, scan, propose, branch)
}

// approveHandler answers POST /api/v1/approve: it records the approval of
// the acting revision's held plan (v1.ApproveRequest); a commit id, a
// malformed digest (400) or one that matches no held plan (409 not_held)
// is refused and nothing is recorded.
func approveHandler(st *state.Store, ctrl *reconciler.Controller, src *gitops.Source) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var req v1.ApproveRequest
		if !decode(w, r, &req) {
			return
		}
		req.Revision = strings.TrimPrefix(req.Revision, "sha256:")
		// A commit id is not an inventory digest (machinactl status
		// prints both side by side): an approval of one could never
		// apply, so it is refused with the digest to use.
		if good, invalid := src.Latest(); req.Revision != "" &&
			(strings.HasPrefix(good.Commit, req.Revision) || invalid != nil && strings.HasPrefix(invalid.Commit, req.Revision)) {
			acting := plan.DigestPrefix(good.Digest)
			if acting == "" {
				acting = "none yet"
			}
			writeErr(w, http.StatusBadRequest, "invalid_revision", fmt.Sprintf("%s is a commit id, not an inventory digest: approve the digest of the revision (acting revision: %s)",
				req.Revision, acting))
			return
		}
		if !revisionRE.MatchString(req.Revision) {
			writeErr(w, http.StatusBadRequest, "invalid_revision", "revision must be 12 to 64 lower-case hex digits of an inventory digest")
			return
		}
		// What is held is read before the approval is recorded: a
		// planning pass after it releases the held steps.
		out := v1.ApproveResponse{Approved: req.Revision}
		held := len(ctrl.LastPlan().Held)
		if d := ctrl.Desired(); d != nil {
			out.Acting = strings.TrimPrefix(d.Digest, "sha256:")
			out.Matches = strings.HasPrefix(out.Acting, req.Revision)
			if out.Matches {
				out.HeldSteps = held
			}
		}
		// Only the held plan of the acting revision can be approved:
		// an approval matching nothing held (a mistyped digest, an
		// old revision) is refused and not recorded, naming what is
		// held. A repeated approval of the acting revision answers as
		// the first did (at-least-once requests).
		if !out.Matches || held == 0 {
			already := false
			if out.Matches {
				already, _ = st.Approved("sha256:" + out.Acting)
			}
			if !already {
				heldMsg := "no revision has a held plan"
				if held > 0 {
					heldMsg = fmt.Sprintf("held: inventory revision %s (%d steps)", plan.DigestPrefix("sha256:"+out.Acting), held)
				} else if out.Acting != "" {
					heldMsg += fmt.Sprintf(" (the controller acts on %s)", plan.DigestPrefix("sha256:"+out.Acting))
				}
				writeErr(w, http.StatusConflict, v1.CodeNotHeld, fmt.Sprintf("inventory revision %s matches no held plan; nothing recorded; %s", req.Revision, heldMsg))
				return
			}
		}
		if err := st.Approve(req.Revision, api.Actor(r)); err != nil {
			writeErr(w, http.StatusBadRequest, "invalid_revision", "revision must be 12 to 64 lower-case hex digits of an inventory digest")
			return
		}
		ctrl.Trigger()
		writeJSON(w, http.StatusOK, out)
	}
}

// provisionHandler answers POST /api/v1/provision: allocate N servers of
// a profile at once (409 when fewer fit), recorded as an event.
func provisionHandler(st *state.Store, ctrl *reconciler.Controller) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var req v1.ProvisionRequest
		if !decode(w, r, &req) {
			return
		}
		names, err := ctrl.Provision(req.Profile, req.Count, api.Actor(r))
		switch {
		case errors.Is(err, reconciler.ErrNoCapacity):
			writeErr(w, http.StatusConflict, "insufficient_capacity", err.Error())
		case err != nil:
			writeErr(w, http.StatusBadRequest, "bad_request", err.Error())
		default:
			_, _ = st.AppendEvent(state.Event{Kind: "provision", Actor: api.Actor(r), Message: "provision " + req.Profile + ": " + strings.Join(names, ", ")})
			writeJSON(w, http.StatusOK, v1.ProvisionResponse{Profile: req.Profile, Servers: names})
		}
	}
}

// revisionRE is an inventory digest's hex, whole or a prefix of at
// least 12 digits (what POST /api/v1/approve takes).
var revisionRE = regexp.MustCompile(`^[0-9a-f]{12,64}$`)

// decode reads a small strict JSON body into v, answering 400 on failure.
func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	dec := json.NewDecoder(io.LimitReader(r.Body, 64<<10))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		writeErr(w, http.StatusBadRequest, "bad_request", "malformed JSON body")
		return false
	}
	return true
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func writeErr(w http.ResponseWriter, code int, errCode, msg string) {
	writeJSON(w, code, map[string]string{"error": msg, "code": errCode})
}

// redactURL drops user information and the query from a URL for logs.
func redactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.Scheme == "" {
		return s
	}
	u.User, u.RawQuery = nil, ""
	return u.String()
}
