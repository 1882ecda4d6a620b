package controller

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/machina-metal/machina/images"
)

// Image import retry bounds: a failed import (a mirror down, no checksum
// entry yet for a new upload) is tried again after importRetryMin,
// doubling up to importRetryMax, until it succeeds or a new inventory
// revision starts a new round.
const (
	importRetryMin = 30 * time.Second
	importRetryMax = 15 * time.Minute
)

// importFailures is the last import error per image name, for the deploy
// gate (DeployReady) to say why a deploy waits. Safe for concurrent use.
type importFailures struct {
	mu sync.Mutex
	m  map[string]importFailure
}

type importFailure struct {
	err     error
	attempt int
	next    time.Time // when the next attempt starts
}

func (f *importFailures) set(name string, v importFailure) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.m == nil {
		f.m = map[string]importFailure{}
	}
	f.m[name] = v
}

func (f *importFailures) clear(name string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.m, name)
}

// reason returns why the import of image name failed last, or nil.
func (f *importFailures) reason(name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	v, ok := f.m[name]
	if !ok {
		return nil
	}
	return fmt.Errorf("import failed (attempt %d, next try at %s): %w", v.attempt, v.next.UTC().Format(time.RFC3339), v.err)
}

// importWithRetry imports reqs with importAll, then retries the failed
// ones with capped exponential backoff (minWait doubling to maxWait) until
// all succeeded or ctx ends (a new revision cancels it). Each failure is
// recorded in fails (and logged), each success clears it; after calls
// after every round (installer trees, a reconcile trigger).
func importWithRetry(ctx context.Context, importAll func(context.Context, []images.Request) []error, reqs []images.Request,
	fails *importFailures, minWait, maxWait time.Duration, after func(), log *slog.Logger) {
	wait := minWait
	for attempt := 1; len(reqs) > 0; attempt++ {
		errs := importAll(ctx, reqs)
		if ctx.Err() != nil {
			return
		}
		var failed []images.Request
		next := time.Now().Add(wait)
		for i, err := range errs {
			if err != nil {
				failed = append(failed, reqs[i])
				fails.set(reqs[i].Name, importFailure{err: err, attempt: attempt, next: next})
				log.Warn("image import", "image", reqs[i].Name, "attempt", attempt, "retry_in", wait, "err", err)
			} else {
				fails.clear(reqs[i].Name)
			}
		}
		if after != nil {
			after()
		}
		reqs = failed
		if len(reqs) == 0 {
			return
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		wait = min(2*wait, maxWait)
	}
}
