package controller

import (
	"time"

	v1 "github.com/machina-metal/machina/api/v1"
)

// gitHealth is the Git side's health for GET /api/v1/status and the
// machina_git_* metrics: the poller's (gitops.Source.Health), the status
// writer's (gitops.StatusWriter.Health) and the revision acted on. The
// API serves only after every stage ran, so w.src and w.writer are set
// (or stay nil: a zero report) before the first call.
func (w *wiring) gitHealth() v1.GitHealth {
	var g v1.GitHealth
	if w.src != nil {
		h := w.src.Health()
		g.Poll = v1.GitLoopHealth{LastSuccess: timePtr(h.LastSuccess), ConsecutiveFailures: h.ConsecutiveFailures,
			Failing: h.ConsecutiveFailures > 0, LastError: h.LastError}
		g.RemoteTip, g.Evaluated, g.Behind = h.RemoteTip, h.Evaluated, h.Behind
		good, _ := w.src.Latest()
		g.ActingCommit, g.ActingDigest = good.Commit, good.Digest
	}
	if w.writer != nil {
		h := w.writer.Health()
		g.Push = v1.GitLoopHealth{LastSuccess: timePtr(h.LastSuccess), ConsecutiveFailures: h.ConsecutiveFailures,
			Failing: h.Failing, LastError: h.LastError}
		g.LastStatusCommit, g.LastStatusPackBytes = h.LastCommit, h.LastPackBytes
	}
	return g
}

// timePtr is &t in UTC, nil for the zero time.
func timePtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	t = t.UTC()
	return &t
}
