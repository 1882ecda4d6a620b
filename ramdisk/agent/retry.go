package agent

import (
	"errors"
	"fmt"
	"net"
	"syscall"
	"time"

	v1 "github.com/machina-metal/machina/api/v1"
)

// retryPolicy bounds and reports the retries of one failing image or piece
// request to the controller: at most attempts requests, and, when within
// is set, none started later than within after the first (so the last
// failure comes at most within plus one stall after it). Each retry is
// told to note (ProgressMeter.Retrying), so the controller hears why the
// bytes stopped, at most a stall and a delay apart.
type retryPolicy struct {
	attempts int           // requests at most; <= 0 means imageAttempts
	within   time.Duration // no attempt starts later than this after the first; 0: no bound
	stall    time.Duration // an attempt's longest wait for a byte (StallTimeout)
	note     func(string)  // told each retry; nil: nobody
}

// retryWithin is the time bound of a plan's retries: SilentAfter less
// ProgressEvery (the controller last heard of moving bytes up to a
// progress interval before the first failure). Zero (no time bound) for
// a controller that sends no SilentAfter, or a SilentAfter not above
// ProgressEvery.
func retryWithin(plan v1.Plan) time.Duration {
	if plan.SilentAfter <= 0 || plan.SilentAfter <= plan.ProgressEvery {
		return 0
	}
	return plan.SilentAfter - max(plan.ProgressEvery, 0)
}

func (p retryPolicy) limit() int {
	if p.attempts > 0 {
		return p.attempts
	}
	return imageAttempts
}

// giveUp reports whether to stop after attempt (1-based) failed, the
// requests having begun at first and the next waiting delay; why says
// so when the time bound stops it ("" when the attempt count does).
func (p retryPolicy) giveUp(attempt int, first time.Time, delay time.Duration) (why string, stop bool) {
	if attempt >= p.limit() {
		return "", true
	}
	if p.within > 0 && time.Since(first)+delay > p.within {
		return fmt.Sprintf("no attempt starts later than %v after the first: the controller's silent-after less a progress interval", p.within), true
	}
	return "", false
}

// retrying tells note that what (the piece or the image download) failed
// with err at attempt and is asked again after delay.
func (p retryPolicy) retrying(what string, attempt int, delay time.Duration, err error) {
	if p.note == nil {
		return
	}
	p.note(v1.RetryText(fmt.Sprintf("%s: %s, retry %d of %d in %v", what, retryCause(err, p.stall), attempt, p.limit()-1, delay), v1.MaxProgressRetryBytes))
}

// retryCause says in a few words why a controller request failed.
func retryCause(err error, stall time.Duration) string {
	var se *v1.AgentStatusError
	var ne net.Error
	switch {
	case errors.Is(err, errStalled):
		return fmt.Sprintf("controller request stalled for %v", stallTimeoutOr(stall))
	case errors.Is(err, errBadPeer):
		return "a wave peer served a bad piece"
	case errors.As(err, &se):
		return fmt.Sprintf("controller answered %d", se.Code)
	case errors.Is(err, syscall.ECONNREFUSED):
		return "controller refused the connection"
	case errors.Is(err, syscall.ECONNRESET):
		return "connection to the controller reset"
	case errors.Is(err, errStreamEnded):
		return "controller response cut short"
	case errors.As(err, &ne) && ne.Timeout():
		return "controller request timed out"
	}
	return v1.RetryText(err.Error(), 160)
}
