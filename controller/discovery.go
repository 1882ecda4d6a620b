package controller

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/machina-metal/machina/api"
	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/discover"
	"github.com/machina-metal/machina/state"
)

// scanFunc runs one scan; production passes discover.Scan (tests wrap it
// to reach loopback emulators, which no request can ask for).
type scanFunc func(ctx context.Context, cfg discover.Config) (*discover.Report, error)

// scanTimeout bounds one scan request.
const scanTimeout = 5 * time.Minute

// mountDiscovery adds POST /api/v1/scan (admin token, audited): scan a
// private IPv4 range for Redfish BMCs with named credentials read from the
// secret store here, so passwords never leave the controller. Answers 200
// with the discover.Report (Incomplete set when the scan ran into
// scanTimeout or the client went away), 400 for a refused range or
// credential list, 404 for an unknown credential name.
func mountDiscovery(srv *api.Server, st *state.Store, scan scanFunc) error {
	return srv.HandleAdmin("POST /api/v1/scan", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req v1.ScanRequest
		if !decode(w, r, &req) {
			return
		}
		if len(req.Credentials) == 0 || len(req.Credentials) > discover.MaxCredentials {
			writeErr(w, http.StatusBadRequest, "bad_request", fmt.Sprintf("give 1 to %d credential names", discover.MaxCredentials))
			return
		}
		creds := make([]discover.Credential, 0, len(req.Credentials))
		for _, name := range req.Credentials {
			c, err := st.Secret(name)
			if errors.Is(err, state.ErrNotFound) || errors.Is(err, state.ErrInvalid) {
				writeErr(w, http.StatusNotFound, "not_found", fmt.Sprintf("credential %q is not in the secret store", name))
				return
			}
			if err != nil {
				writeErr(w, http.StatusInternalServerError, "internal", "read credential "+name)
				return
			}
			creds = append(creds, discover.Credential{Name: name, Username: c.Username, Password: c.Password})
		}
		if req.Port < 0 || req.Port > 65535 {
			writeErr(w, http.StatusBadRequest, "bad_request", "port out of range")
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
		writeJSON(w, http.StatusOK, rep)
	}))
}
