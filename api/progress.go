package api

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/state"
)

// maxProgressBytes bounds a progress report's byte counts (1 PiB, the
// largest disk a commissioning report may name).
const maxProgressBytes = maxReportDisk

// errNotProgressing refuses a progress report for a server that is not
// running an image deploy (or, for an erase step, a release wipe).
var errNotProgressing = errors.New("server is not deploying or wiping")

// progress takes a ramdisk's progress report of a long deploy step
// (v1.PathAgentProgress) with the deploy's reusable image token, which it
// checks and does not consume. The report is validated (a known step,
// 0 <= bytesDone <= bytesTotal <= 1 PiB, a rate >= 0, a strict body of at
// most v1.MaxProgressBytes) and rate-limited per server: one taken per
// half of ProgressEvery, anything sooner answered 429 without a store
// write. It writes no event and never moves the lifecycle: in one update
// of the server's record it stores the report (state.Server.Progress) and,
// only when the step or its bytes moved forward, notes the machine as
// heard, so a machine that keeps reporting the same bytes goes silent for
// the plan's re-netboot (plan.Options.SilentAfter) as one that reports
// nothing. A server that is not deploying answers 409.
func (m *Machine) progress(w http.ResponseWriter, r *http.Request) {
	// The body (at most 1 KiB) is read first: its step says which token
	// it needs (a release wipe's erase reports with the wipe plan's
	// progress token).
	var p v1.Progress
	_, code, err := readStrict(r, v1.MaxProgressBytes, &p)
	purpose := state.PurposeImage
	if err == nil && p.Step == v1.StepErase {
		purpose = state.PurposeEraseProgress
	}
	t, terr := m.cfg.Store.CheckToken(bearer(r), state.TokenClaim{Purpose: purpose})
	if terr != nil {
		m.refuse(w, r, terr)
		return
	}
	if m.wrongAddress(w, r, t.Server) {
		return
	}
	if err == nil {
		code = http.StatusBadRequest
		err = checkProgress(p)
	}
	if err != nil {
		m.bad(w, r, t.Server, code, "progress: "+err.Error())
		return
	}
	if wait, ok := m.progressAllowed(t.Server); !ok {
		w.Header().Set("Retry-After", strconv.Itoa(int(wait.Seconds())+1))
		writeError(w, http.StatusTooManyRequests, v1.Error{Message: "progress reported too often", Code: "rate_limited"})
		return
	}
	_, err = m.cfg.Store.UpdateServer(t.Server, func(s *state.Server) error {
		if (purpose == state.PurposeImage && s.Lifecycle != state.LifecycleDeploying) || (purpose == state.PurposeEraseProgress && !s.Wiping()) {
			return &answerError{status: http.StatusConflict, body: v1.Error{Message: errNotProgressing.Error(), Code: "conflict", Lifecycle: string(s.Lifecycle)}}
		}
		noteProgress(s, p, time.Now().UTC(), m.cfg.SilentAfter)
		return nil
	})
	var ae *answerError
	switch {
	case errors.As(err, &ae):
		writeError(w, ae.status, ae.body)
		return
	case m.readFailed(w, r, err):
		return
	case err != nil:
		writeError(w, http.StatusConflict, v1.Error{Message: errNotProgressing.Error(), Code: "conflict"})
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// noteProgress stores p on s at now. A report that moved forward (another
// step, or more bytes of the same step, than the report stored since the
// phase began or the last re-netboot) also notes the machine as heard, and
// so does one naming a new retry (v1.Progress.Retry) while less than
// silentAfter (the plan's v1.Plan.SilentAfter; <= 0: no bound) has passed
// since the last report that moved forward; one that did neither leaves
// LastHeardAt, and Progress.AdvancedAt, as they were. The agent bounds its
// retries within silentAfter; the bound here holds for an agent that does
// not (a wedged or hostile one naming a new retry forever): its retries
// stop counting, so it goes silent at most twice silentAfter after its
// bytes last moved, and is booted again.
func noteProgress(s *state.Server, p v1.Progress, now time.Time, silentAfter time.Duration) {
	prev := s.Progress
	if prev != nil && (prev.At.Before(s.LifecycleAt) || prev.At.Before(s.RenetbootAt) || (s.Wiping() && prev.At.Before(s.WipeStartedAt))) {
		prev = nil // from an earlier boot
	}
	advanced := prev == nil || p.Step != prev.Step || p.BytesDone > prev.BytesDone
	// A new retry (the agent names each one, with its number) is the
	// agent working through its bounded retries: heard, though no byte
	// moved. The same retry reported again is not.
	retried := p.Retry != "" && (prev == nil || p.Retry != prev.Retry)
	next := &state.Progress{Step: p.Step, BytesDone: p.BytesDone, BytesTotal: p.BytesTotal, RateBytesPerSecond: p.RateBytesPerSecond, Retry: p.Retry, At: now}
	if prev != nil {
		next.AdvancedAt = prev.AdvancedAt
	}
	if advanced {
		next.AdvancedAt = now
	}
	if retried && !advanced && silentAfter > 0 {
		since := next.AdvancedAt
		if since.IsZero() {
			since = s.LifecycleAt
		}
		retried = now.Sub(since) < silentAfter
	}
	if advanced || retried {
		s.LastHeard, s.LastHeardAt = fmt.Sprintf("progress: %s %d of %d bytes", p.Step, p.BytesDone, p.BytesTotal), now
		if p.Retry != "" {
			s.LastHeard += "; retrying: " + p.Retry
		}
	}
	s.Progress = next
}

// checkProgress refuses a report that is not well formed.
func checkProgress(p v1.Progress) error {
	switch p.Step {
	case v1.StepImageDownload, v1.StepImageWrite, v1.StepImageReadBack, v1.StepErase:
	default:
		return fmt.Errorf("step %q: want %s, %s, %s or %s", p.Step, v1.StepImageDownload, v1.StepImageWrite, v1.StepImageReadBack, v1.StepErase)
	}
	if p.BytesTotal < 0 || p.BytesTotal > maxProgressBytes {
		return fmt.Errorf("bytesTotal %d: must be 0 to %d", p.BytesTotal, int64(maxProgressBytes))
	}
	if p.BytesDone < 0 || p.BytesDone > p.BytesTotal {
		return fmt.Errorf("bytesDone %d: must be 0 to bytesTotal %d", p.BytesDone, p.BytesTotal)
	}
	if p.RateBytesPerSecond < 0 || p.RateBytesPerSecond > maxProgressBytes {
		return fmt.Errorf("rateBytesPerSecond %d: must be 0 to %d", p.RateBytesPerSecond, int64(maxProgressBytes))
	}
	return v1.CheckRetry(p.Retry)
}

// progressAllowed reports whether server's progress report may be taken
// now (the last one taken at least half of ProgressEvery ago), and
// records it; otherwise how long to wait.
func (m *Machine) progressAllowed(server string) (time.Duration, bool) {
	gap := m.cfg.ProgressEvery / 2
	now := time.Now()
	m.progressMu.Lock()
	defer m.progressMu.Unlock()
	if last, ok := m.progressAt[server]; ok && now.Sub(last) < gap {
		return gap - now.Sub(last), false
	}
	m.progressAt[server] = now
	if len(m.progressAt) > maxProgressEntries {
		// Entries older than a gap limit nothing: drop them.
		for k, at := range m.progressAt {
			if now.Sub(at) >= gap {
				delete(m.progressAt, k)
			}
		}
	}
	return 0, true
}

// maxProgressEntries is the size past which progressAllowed drops the
// entries that no longer limit anything.
const maxProgressEntries = 4096
