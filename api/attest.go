package api

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/attestation"
	"github.com/machina-metal/machina/state"
)

// Attestation policies (profiles.yaml attestation:).
const (
	// AttestRequired: a request that releases a secret or moves the server
	// (report, plan, done, wipe) needs a verified TPM attestation first; a
	// machine without a TPM is refused.
	AttestRequired = "required"
	// AttestOptional: a machine with a TPM attests, one without goes on;
	// a server whose EK is pinned must attest. The default.
	AttestOptional = "optional"
	// AttestOff: no attestation; the attestation endpoints answer 409
	// v1.CodeAttestationOff.
	AttestOff = "off"
)

// AttestRule is what attestation a server needs.
type AttestRule struct {
	// Mode is AttestRequired, AttestOptional or AttestOff; "" means
	// AttestOptional.
	Mode string
	// PinnedEK is the EK fingerprint the inventory pins for the server
	// (servers.yaml tpm.ek, attestation.Fingerprint form), "" when none.
	// Unless Mode is off, a pinned EK makes attestation required, and
	// another EK is refused.
	PinnedEK string
	// Chain is what the controller served the server to boot; the zero
	// value checks only the event log's replay.
	Chain attestation.BootChain
}

// AttestPolicy gives each server's AttestRule; the controller's comes from
// the inventory. Safe for concurrent use.
type AttestPolicy interface {
	AttestRule(server string) AttestRule
}

// eventAttestRefused is the event kind of a refused attestation (paced
// like machine.refused: one at once, then one summary per interval).
const eventAttestRefused state.EventKind = "machine.attestation_refused"

// attestState is the Machine's attestation side.
type attestState struct {
	v   *attestation.Verifier
	mu  sync.Mutex
	ref map[string]int64 // refusals by attestation.Reason
}

func (m *Machine) attestRule(server string) AttestRule {
	if m.cfg.AttestPolicy == nil {
		return AttestRule{Mode: AttestOptional}
	}
	r := m.cfg.AttestPolicy.AttestRule(server)
	if r.Mode == "" {
		r.Mode = AttestOptional
	}
	return r
}

// attestToken finds the live token a attestation request carries: one of
// the purposes whose request the attestation releases, not expired, not
// used. It is checked, never consumed.
func (m *Machine) attestToken(tok string) (state.Token, error) {
	err := state.ErrTokenUnknown
	for _, p := range []state.Purpose{state.PurposeReport, state.PurposePlan, state.PurposeDone, state.PurposeWipe} {
		var t state.Token
		t, err = m.cfg.Store.PeekToken(tok, state.TokenClaim{Purpose: p})
		switch {
		case errors.Is(err, state.ErrTokenMismatch):
			continue
		case err != nil:
			return state.Token{}, err
		case !time.Now().Before(t.ExpiresAt):
			return state.Token{}, state.ErrTokenExpired
		case !t.Reusable && t.Uses > 0:
			return state.Token{}, state.ErrTokenUsed
		}
		return t, nil
	}
	return state.Token{}, err
}

// attestBegin is PathAgentAttest: check the EK and AK, answer a challenge.
func (m *Machine) attestBegin(w http.ResponseWriter, r *http.Request) {
	t, err := m.attestToken(bearer(r))
	if err != nil {
		m.refuse(w, r, err)
		return
	}
	if m.wrongAddress(w, r, t.Server) {
		return
	}
	var req v1.AttestRequest
	if _, code, err := readStrict(r, v1.MaxAttestRequestBytes, &req); err != nil {
		m.bad(w, r, t.Server, code, "attest: "+err.Error())
		return
	}
	srv, err := m.cfg.Store.Server(t.Server)
	if m.readFailed(w, r, err) {
		return
	}
	if err == nil && srv.BootMAC != "" && !strings.EqualFold(req.BootMAC, srv.BootMAC) {
		m.bad(w, r, t.Server, http.StatusBadRequest, fmt.Sprintf("attest: bootMAC %q is not %s", req.BootMAC, srv.BootMAC))
		return
	}
	rule := m.attestRule(t.Server)
	if rule.Mode == AttestOff {
		writeError(w, http.StatusConflict, v1.Error{Message: "attestation is off for this server", Code: v1.CodeAttestationOff})
		return
	}
	ch, fp, err := m.att.v.Challenge(t.Server, t.ID, rule.PinnedEK, req)
	if err != nil {
		m.attestRefused(w, t.Server, fp, err)
		return
	}
	writeJSON(w, http.StatusOK, ch)
}

// attestQuote is PathAgentAttestQuote: verify the evidence, record the EK
// (the enrolment) and release the token's request.
func (m *Machine) attestQuote(w http.ResponseWriter, r *http.Request) {
	t, err := m.attestToken(bearer(r))
	if err != nil {
		m.refuse(w, r, err)
		return
	}
	if m.wrongAddress(w, r, t.Server) {
		return
	}
	var ev v1.AttestEvidence
	if _, code, err := readStrict(r, v1.MaxAttestEvidenceBytes, &ev); err != nil {
		m.bad(w, r, t.Server, code, "attest quote: "+err.Error())
		return
	}
	rule := m.attestRule(t.Server)
	res, err := m.att.v.Verify(t.Server, t.ID, ev, rule.Chain)
	if err != nil {
		m.attestRefused(w, t.Server, "", err)
		return
	}
	now := time.Now().UTC()
	var prev string
	if _, err := m.cfg.Store.UpdateServer(t.Server, func(s *state.Server) error {
		next := &state.TPM{EK: res.EK, EKIssuer: res.EKIssuer, AttestedAt: now, BootApplications: res.Applications}
		if s.TPM != nil {
			prev = s.TPM.EK
			if s.TPM.Proposed == res.EK {
				next.Proposed, next.ProposalBranch = s.TPM.Proposed, s.TPM.ProposalBranch
			}
		}
		s.TPM = next
		return nil
	}); err != nil {
		if storeUnavailable(err) {
			unavailable(w)
			return
		}
		m.log.Error("record attestation", "machine", t.Server, "err", err)
		writeError(w, http.StatusInternalServerError, v1.Error{Message: "internal error", Code: "internal"})
		return
	}
	switch {
	case prev == "":
		_, _ = m.cfg.Store.AppendEvent(state.Event{Server: t.Server, Kind: "tpm.enrolled", Message: "TPM enrolled: EK " + res.EK})
	case prev != res.EK:
		_, _ = m.cfg.Store.AppendEvent(state.Event{Server: t.Server, Kind: "tpm.ek_changed", Message: fmt.Sprintf("TPM EK changed from %s to %s (no EK is pinned in servers.yaml)", prev, res.EK)})
	}
	m.log.Info("attestation verified", "machine", t.Server, "ek", res.EK, "events", res.Events, "applications", res.Applications, "kernels", res.Kernels)
	w.WriteHeader(http.StatusNoContent)
}

// attestRefused counts and records (paced event; on the server a
// condition when the EK is not the pinned one) a refused attestation and
// answers 403.
func (m *Machine) attestRefused(w http.ResponseWriter, server, seenEK string, err error) {
	why := attestation.Reason(err)
	m.att.mu.Lock()
	m.att.ref[why]++
	m.att.mu.Unlock()
	msg := "attestation refused: " + err.Error()
	m.cfg.Store.RecordRefusal(server, eventAttestRefused, state.RefusalBadRequest, msg)
	// The condition's record is written once per refused EK, not per
	// request: a flood of refusals writes nothing more.
	if errors.Is(err, attestation.ErrEKMismatch) && m.newRefusedEK(server, seenEK) {
		_, _ = m.cfg.Store.UpdateServer(server, func(s *state.Server) error {
			if s.TPM == nil {
				s.TPM = &state.TPM{}
			}
			s.TPM.Refused, s.TPM.RefusedEK, s.TPM.RefusedAt = msg, seenEK, time.Now().UTC()
			return nil
		})
	}
	writeError(w, http.StatusForbidden, v1.Error{Message: msg, Code: v1.CodeAttestationRefused})
}

// newRefusedEK reports whether ek is not the refused EK already recorded
// on server.
func (m *Machine) newRefusedEK(server, ek string) bool {
	cur, err := m.cfg.Store.Server(server)
	return err == nil && (cur.TPM == nil || cur.TPM.RefusedEK != ek)
}

// attestGate answers 403 (and reports true) when the request with token t
// needs a verified attestation it does not have: policy required, or an EK
// pinned, unless the policy is off. Each attestation lets one request
// through (attestation.Verifier.Take), also for a token already used: the
// plan route answers a repeated request with fresh tokens and the seed's
// secrets, so a request replayed from the server's address with a
// captured plan token must not pass on the real machine's attestation.
// The agent attests before every try of a gated request.
func (m *Machine) attestGate(w http.ResponseWriter, t state.Token) bool {
	rule := m.attestRule(t.Server)
	if rule.Mode == AttestOff {
		return false
	}
	if _, ok := m.att.v.Take(t.Server, t.ID); ok {
		return false
	}
	if rule.Mode != AttestRequired && rule.PinnedEK == "" {
		return false
	}
	why := "policy required"
	if rule.PinnedEK != "" {
		why = "EK " + rule.PinnedEK + " pinned"
	}
	m.att.mu.Lock()
	m.att.ref["missing"]++
	m.att.mu.Unlock()
	m.cfg.Store.RecordRefusal(t.Server, eventAttestRefused, state.RefusalBadRequest,
		fmt.Sprintf("%s refused: no verified TPM attestation (%s)", t.Purpose, why))
	writeError(w, http.StatusForbidden, v1.Error{Message: "a verified TPM attestation is required first (" + why + ")", Code: v1.CodeAttestationRequired})
	return true
}

var descAttestRefusals = prometheus.NewDesc("machina_attestation_refusals_total",
	"TPM attestations refused, by reason: ek_mismatch, ek_certificate, ak_parameters, challenge (unknown, used or expired: a replayed nonce), activation, quote, event_log, boot_chain, other, and missing (a request that needed an attestation came without one).",
	[]string{"reason"}, nil)

// AttestCollector exports machina_attestation_refusals_total.
func (m *Machine) AttestCollector() prometheus.Collector { return attestCollector{m} }

type attestCollector struct{ m *Machine }

func (c attestCollector) Describe(ch chan<- *prometheus.Desc) { ch <- descAttestRefusals }

func (c attestCollector) Collect(ch chan<- prometheus.Metric) {
	counts := c.m.AttestRefusals()
	for _, why := range append(attestation.Reasons, "missing") {
		ch <- prometheus.MustNewConstMetric(descAttestRefusals, prometheus.CounterValue, float64(counts[why]), why)
	}
}

// AttestRefusals returns the refused attestations by reason since start.
func (m *Machine) AttestRefusals() map[string]int64 {
	m.att.mu.Lock()
	defer m.att.mu.Unlock()
	out := make(map[string]int64, len(m.att.ref))
	for k, v := range m.att.ref {
		out[k] = v
	}
	return out
}
