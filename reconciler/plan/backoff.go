package plan

import "time"

// RetryDelay is the delay before retry n (1-based) without jitter:
// base·2^(n-1), capped at maxDelay. n below 2 gives base (capped).
// Deterministic: the plan's retry times (a failed release wipe's) use it
// as is.
func RetryDelay(base, maxDelay time.Duration, n int) time.Duration {
	d := base
	for i := 1; i < n && d < maxDelay; i++ {
		d *= 2
	}
	return min(d, maxDelay)
}

// Backoff is RetryDelay with ±20% jitter, so a rack of failing BMCs does
// not retry in lockstep: jitter in [0,1) scales the delay by 0.8 to 1.2.
// The caller draws jitter (rand.Float64()), so Backoff stays a pure
// function of its inputs. The executor's failed steps and gitops's failed
// enrolment proposals wait this long.
func Backoff(base, maxDelay time.Duration, n int, jitter float64) time.Duration {
	return time.Duration(float64(RetryDelay(base, maxDelay, n)) * (0.8 + 0.4*jitter))
}
