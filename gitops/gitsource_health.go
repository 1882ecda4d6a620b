package gitops

import (
	"time"

	"github.com/go-git/go-git/v5/plumbing"

	"github.com/machina-metal/machina/redact"
)

// SourceHealth is the poller's condition, for metrics, the API and the UI.
type SourceHealth struct {
	// LastSuccess is when a poll last succeeded (listed the remote, fetched
	// what moved and evaluated it); zero if none has yet.
	LastSuccess time.Time
	// LastAttempt is when the last poll ended, successful or not.
	LastAttempt time.Time
	// ConsecutiveFailures counts failed polls since the last success.
	ConsecutiveFailures int
	// LastError is the last poll's error, redacted ("" after a success).
	LastError string
	// RemoteTip is the branch tip the remote listed at the last poll that
	// reached it (40 hex digits; "" before one did).
	RemoteTip string
	// Evaluated is the branch tip the poller last fetched and evaluated
	// ("" before the first).
	Evaluated string
	// Behind is how many commits RemoteTip is ahead of Evaluated along
	// first parents (0 when they are the same commit), at most
	// maxBehindWalk; -1 when RemoteTip is not in the clone (its fetch
	// failed) or does not descend from Evaluated within that walk.
	Behind int
}

// maxBehindWalk bounds the first-parent walk that counts Behind.
const maxBehindWalk = 1000

// failureLogEvery is the least time between two "still failing" log lines
// of one outage of the poller or the status writer: the first failure is
// logged at once, later ones at this pace with their count, never every
// pass.
const failureLogEvery = 5 * time.Minute

// failurePacer says when a repeated failure is logged again.
type failurePacer struct {
	last time.Time // when the current outage was last logged; zero: not yet
}

// due reports whether a failure at now, the failures-th of its outage,
// is logged: the first always, then at most once per failureLogEvery.
func (p *failurePacer) due(now time.Time, failures int) bool {
	if failures <= 1 || p.last.IsZero() || now.Sub(p.last) >= failureLogEvery {
		p.last = now
		return true
	}
	return false
}

// reset ends an outage.
func (p *failurePacer) reset() { p.last = time.Time{} }

// Health returns the poller's condition. Safe for concurrent use.
func (s *Source) Health() SourceHealth {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.health
}

// notePoll records the outcome of one poll in s.health (Poll's goroutine,
// which owns s.tip and the clone) and logs a failure that goes on at the
// pace of failurePacer; failures is the count including this one.
func (s *Source) notePoll(err error, failures int) {
	now := s.clock()
	behind := s.behind()
	s.mu.Lock()
	h := &s.health
	h.LastAttempt = now
	h.Behind = behind
	if !s.tip.IsZero() {
		h.Evaluated = s.tip.String()
	}
	if err == nil {
		h.LastSuccess, h.ConsecutiveFailures, h.LastError = now, 0, ""
		s.pacer.reset()
		s.mu.Unlock()
		return
	}
	h.ConsecutiveFailures = failures
	h.LastError = redact.String(err.Error())
	log := failures > 1 && s.pacer.due(now, failures)
	if failures == 1 {
		s.pacer.due(now, failures) // Poll logged the first one
	}
	msg := h.LastError
	s.mu.Unlock()
	if log {
		s.log.Warn("inventory remote still unreachable, keeping last good revision", "failures", failures, "err", msg)
	}
}

// noteRemoteTip records the tip the remote listed.
func (s *Source) noteRemoteTip(tip plumbing.Hash) {
	s.mu.Lock()
	s.health.RemoteTip = tip.String()
	s.remoteTip = tip
	s.mu.Unlock()
}

// behind counts the commits from the last listed remote tip down to the
// evaluated tip along first parents (see SourceHealth.Behind).
func (s *Source) behind() int {
	s.mu.Lock()
	rt := s.remoteTip
	s.mu.Unlock()
	if rt.IsZero() || rt == s.tip {
		return 0
	}
	h := rt
	for n := 0; n < maxBehindWalk; n++ {
		if h == s.tip {
			return n
		}
		c, err := s.repo.CommitObject(h)
		if err != nil || len(c.ParentHashes) == 0 {
			return -1
		}
		h = c.ParentHashes[0]
	}
	return -1
}

// clock is time.Now unless a test set s.now.
func (s *Source) clock() time.Time {
	if s.now != nil {
		return s.now()
	}
	return time.Now()
}
