package join

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/join/spec"
	"github.com/machina-metal/machina/state"
)

// Token TTL bounds.
const (
	DefaultTokenTTL = time.Hour
	MaxTokenTTL     = 7 * 24 * time.Hour
)

// ErrTTL is returned for a TTL that does not parse or is out of bounds.
var ErrTTL = errors.New("join: token ttl must be a duration between 1s and 168h")

// IssueToken validates req and stores a single-use enrolment token. It
// returns the token with the listener's URL, CA fingerprint and install
// script SHA-256 (everything FirstBootCommand needs). actor names the
// issuer for the record ("controller" for deploys). Errors: ErrTTL, or
// spec errors (errors.Is spec.ErrInvalid) listing every bad field.
func (s *Server) IssueToken(req v1.EnrolmentRequest, actor string) (v1.EnrolmentToken, error) {
	ttl := DefaultTokenTTL
	if req.TTL != "" {
		d, err := time.ParseDuration(req.TTL)
		if err != nil || d < time.Second || d > MaxTokenTTL {
			return v1.EnrolmentToken{}, fmt.Errorf("%w (got %q)", ErrTTL, req.TTL)
		}
		ttl = d
	}
	if err := spec.Enrolment(req); err != nil {
		return v1.EnrolmentToken{}, fmt.Errorf("join: issue token: %w", err)
	}
	data, err := json.Marshal(payload{Site: req.Site, Rack: req.Rack, Tags: req.Tags, Networks: req.Networks,
		Pools: req.Pools, Require: req.Require, MinMemoryBytes: req.MinMemoryBytes, Host: req.Host, Server: req.Server, Deploy: req.Deploy})
	if err != nil {
		return v1.EnrolmentToken{}, fmt.Errorf("join: issue token: %w", err)
	}
	val, rec, err := s.cfg.Store.IssueEnrolmentToken(ttl, data, actor)
	if err != nil {
		return v1.EnrolmentToken{}, fmt.Errorf("join: issue token: %w", err)
	}
	s.log.Info("enrolment token issued", "token", rec.ID, "actor", actor, "expires", rec.ExpiresAt)
	return v1.EnrolmentToken{Token: val, ID: rec.ID, ExpiresAt: rec.ExpiresAt, JoinURL: s.cfg.URL,
		CAFingerprint: s.cfg.CA.Fingerprint(), ScriptSHA256: ScriptSHA256()}, nil
}

// AdminMux is where RegisterAdmin mounts its routes; *api.Server
// implements it (HandleAdmin wraps h in admin-token authentication).
type AdminMux interface {
	HandleAdmin(pattern string, h http.Handler) error
}

// RegisterAdmin mounts the join admin routes on mux:
//
//	POST /api/v1/join/tokens  body v1.EnrolmentRequest → 201 v1.EnrolmentToken
//	GET  /api/v1/hosts        → 200 v1.HostList (online from heartbeats)
//	GET  /api/v1/join/info    → 200 v1.JoinInfo (URL, pins, CA PEM)
//
// actor(r), when non-nil, names the admin token for the token record
// (pass api.Actor).
func RegisterAdmin(mux AdminMux, s *Server, actor func(*http.Request) string) error {
	if actor == nil {
		actor = func(*http.Request) string { return "" }
	}
	create := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req v1.EnrolmentRequest
		if !decode(w, r, &req) {
			return
		}
		tok, err := s.IssueToken(req, actor(r))
		switch {
		case errors.Is(err, ErrTTL), errors.Is(err, spec.ErrInvalid):
			fail(w, http.StatusBadRequest, v1.CodeBadRequest, "%v", err)
		case err != nil:
			s.log.Error("issue enrolment token", "err", err)
			fail(w, http.StatusInternalServerError, v1.CodeInternal, "internal error")
		default:
			w.Header().Set("Cache-Control", "no-store")
			writeJSON(w, http.StatusCreated, tok)
		}
	})
	list := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hs, err := s.cfg.Store.Hosts()
		if err != nil {
			s.log.Error("list hosts", "err", err)
			fail(w, http.StatusInternalServerError, v1.CodeInternal, "internal error")
			return
		}
		writeJSON(w, http.StatusOK, v1.HostList{Items: s.HostViews(hs)})
	})
	if err := mux.HandleAdmin("POST /api/v1/join/tokens", create); err != nil {
		return fmt.Errorf("join: register admin: %w", err)
	}
	if err := mux.HandleAdmin("GET /api/v1/hosts", list); err != nil {
		return fmt.Errorf("join: register admin: %w", err)
	}
	info := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, v1.JoinInfo{JoinURL: s.cfg.URL, CAFingerprint: s.cfg.CA.Fingerprint(),
			ScriptSHA256: ScriptSHA256(), CA: string(s.cfg.CA.PEM())})
	})
	if err := mux.HandleAdmin("GET /api/v1/join/info", info); err != nil {
		return fmt.Errorf("join: register admin: %w", err)
	}
	return nil
}

// HostViews converts host records to their API form, with Online computed
// from LastSeen and the heartbeat interval.
func (s *Server) HostViews(hs []state.Host) []v1.Host {
	now := s.cfg.Now()
	out := make([]v1.Host, 0, len(hs))
	for _, h := range hs {
		out = append(out, HostView(h, now, s.cfg.Heartbeat))
	}
	return out
}

// HostView converts one host record to its API form: Online from LastSeen
// and the heartbeat interval, Lost and Fenced with their conditions.
func HostView(h state.Host, now time.Time, heartbeat time.Duration) v1.Host {
	v := v1.Host{Name: h.Name, Server: h.Server, Site: h.Site, Rack: h.Rack, Tags: h.Tags,
		Online: Online(h, now, heartbeat) && h.Lost == nil && h.Fenced == nil, JoinedAt: h.JoinedAt, LastSeen: h.LastSeen,
		JoinStatus: h.JoinStatus, JoinReason: h.JoinReason, Networks: h.Networks, StoragePools: h.StoragePools,
		BootedAt: h.BootedAt, AgentVersion: h.AgentVersion, Conditions: HostConditions(h)}
	if l := h.Lost; l != nil {
		v.Lost = &v1.HostLost{Since: l.Since, Detected: l.Detected, Power: string(l.Power), PowerAt: l.PowerAt, PowerError: l.PowerError, Summary: l.Describe()}
	}
	if f := h.Fenced; f != nil {
		v.Fenced = &v1.HostFence{At: f.At, Actor: f.Actor, Reason: f.Reason, Device: f.Device, Auto: f.Auto}
		if n := h.FenceNotHeld; n != nil {
			v.Fenced.NotHeld = &v1.FenceNotHeld{Since: n.Since, Last: n.Last, Heartbeats: n.Heartbeats}
		}
	}
	return v
}

// Host condition types and reasons (status/, the API, machinactl, the UI).
const (
	ConditionHostLost = "HostLost" // reasons LostPoweredOn, LostPoweredOff, LostPowerUnknown
	ConditionFenced   = "Fenced"   // reasons FencedByOperator, FencedAutomatically
	// ConditionFenceFailed: the host heartbeats while fenced, so the
	// fence did not hold (reason HeartbeatWhileFenced).
	ConditionFenceFailed = "FenceFailed"
)

// HostConditions lists h's conditions: HostLost while it misses its
// heartbeats (the reason says the power its BMC read), Fenced while its
// server is fenced, FenceFailed while it is fenced and heartbeats.
func HostConditions(h state.Host) []v1.HostCondition {
	var out []v1.HostCondition
	if l := h.Lost; l != nil {
		reason := "LostPowerUnknown"
		switch l.Power {
		case state.PowerOn:
			reason = "LostPoweredOn"
		case state.PowerOff:
			reason = "LostPoweredOff"
		}
		out = append(out, v1.HostCondition{Type: ConditionHostLost, Reason: reason, Since: l.Since,
			Message: fmt.Sprintf("%s: no heartbeat since %s", l.Describe(), l.Since.UTC().Format(time.RFC3339))})
	}
	if f := h.Fenced; f != nil {
		reason, by := "FencedByOperator", "by "+f.Actor
		if f.Auto {
			reason, by = "FencedAutomatically", "automatically"
		}
		out = append(out, v1.HostCondition{Type: ConditionFenced, Reason: reason, Since: f.At,
			Message: fmt.Sprintf("fenced %s through %s: %s; never powered on until machinactl host unfence %s", by, f.Device, f.Reason, h.Name)})
	}
	if n := h.FenceNotHeld; n != nil && h.Fenced != nil {
		out = append(out, v1.HostCondition{Type: ConditionFenceFailed, Reason: "HeartbeatWhileFenced", Since: n.Since,
			Message: FenceNotHeldMessage(h)})
	}
	return out
}

// FenceNotHeldMessage says, for people, that h heartbeats while fenced
// (h.Fenced and h.FenceNotHeld set): the status file, the API's condition
// and the join listener's log line share it.
func FenceNotHeldMessage(h state.Host) string {
	n, f := h.FenceNotHeld, h.Fenced
	if n == nil || f == nil {
		return ""
	}
	return fmt.Sprintf("fence did not hold: %d heartbeats since %s (last %s) although %s read back off at %s; the host runs: check its power and the fencing device, then fence again or unfence",
		n.Heartbeats, n.Since.UTC().Format(time.RFC3339), n.Last.UTC().Format(time.RFC3339), f.Device, f.At.UTC().Format(time.RFC3339))
}
