package controller

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/machina-metal/machina/images"
)

// TestImportRetriesWithBackoff: a failed image import is retried with
// doubling waits (30s, 60s, ...) until it succeeds; meanwhile the failure
// and its attempt count are what the deploy gate reports; success clears
// it. Before this fix an import was tried once per revision, so an image
// whose checksum entry appeared later never imported and its servers sat
// in allocated.
func TestImportRetriesWithBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		var at []time.Duration
		var fails importFailures
		var seen []string
		importAll := func(_ context.Context, reqs []images.Request) []error {
			at = append(at, time.Since(start))
			errs := make([]error, len(reqs))
			for i, r := range reqs {
				if r.Name == "bad" && len(at) < 4 {
					errs[i] = errors.New("no checksum entry for os.img in SHA256SUMS")
				}
			}
			return errs
		}
		rounds := 0
		after := func() {
			rounds++
			if err := fails.reason("bad"); err != nil {
				seen = append(seen, err.Error())
			}
			if fails.reason("good") != nil {
				t.Error("a successful import is reported as failed")
			}
		}
		importWithRetry(t.Context(), importAll, []images.Request{{Name: "good"}, {Name: "bad"}}, &fails, 30*time.Second, 80*time.Second,
			after, slog.New(slog.NewTextHandler(t.Output(), nil)))
		want := []time.Duration{0, 30 * time.Second, 90 * time.Second, 170 * time.Second} // waits 30, 60, 80 (capped)
		if len(at) != len(want) {
			t.Fatalf("attempts at %v, want %v", at, want)
		}
		for i := range want {
			if at[i] != want[i] {
				t.Errorf("attempt %d at %v, want %v", i+1, at[i], want[i])
			}
		}
		if rounds != 4 || len(seen) != 3 || !strings.Contains(seen[0], "attempt 1") || !strings.Contains(seen[2], "attempt 3") || !strings.Contains(seen[0], "no checksum entry") {
			t.Errorf("rounds %d, reasons %q", rounds, seen)
		}
		if err := fails.reason("bad"); err != nil {
			t.Errorf("after the import succeeded: reason %v, want none", err)
		}
	})
}

// TestImportRetryStopsOnCancel: a new revision cancels the previous
// round's retries.
func TestImportRetryStopsOnCancel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		n := 0
		done := make(chan struct{})
		go func() {
			defer close(done)
			importWithRetry(ctx, func(context.Context, []images.Request) []error { n++; return []error{errors.New("down")} },
				[]images.Request{{Name: "x"}}, &importFailures{}, time.Minute, time.Hour, nil, slog.New(slog.DiscardHandler))
		}()
		time.Sleep(90 * time.Second) // two attempts: 0 and 60s
		cancel()
		<-done
		if n != 2 {
			t.Errorf("%d attempts before the cancel, want 2", n)
		}
	})
}
