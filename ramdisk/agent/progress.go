package agent

import (
	"context"
	"log/slog"
	"sync"
	"time"

	v1 "github.com/machina-metal/machina/api/v1"
)

// ProgressMeter holds how far a long step is: WriteConfig.Progress updates
// it on the write's goroutine, and ReportProgress reads it on its own.
// Safe for concurrent use; the zero value is ready.
type ProgressMeter struct {
	mu          sync.Mutex
	step        string
	done, total int64
}

// Set records that step has done of total bytes done (WriteConfig.Progress).
func (m *ProgressMeter) Set(step string, done, total int64) {
	m.mu.Lock()
	m.step, m.done, m.total = step, done, total
	m.mu.Unlock()
}

// Read returns the last Set; step is "" before one.
func (m *ProgressMeter) Read() (step string, done, total int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.step, m.done, m.total
}

// ReportProgress posts what m says every every (v1.Plan.ProgressEvery)
// until ctx ends, with post (the AgentClient's Progress with the image
// token), starting one interval in. The rate is the bytes done over the
// last interval of the same step. Each post is bounded by an interval (at
// most callTimeout); one that fails, or is refused (429 when the
// controller's clock runs ahead, 409 once the deploy is over), is logged
// and not retried: the next interval carries newer numbers, and a
// progress report never holds up the write. Nothing is posted before the
// first Set. every <= 0 posts nothing.
func ReportProgress(ctx context.Context, every time.Duration, m *ProgressMeter, post func(context.Context, v1.Progress) error, log *slog.Logger) {
	if every <= 0 {
		return
	}
	t := time.NewTicker(every)
	defer t.Stop()
	var lastStep string
	var lastDone int64
	last := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		step, done, total := m.Read()
		if step == "" {
			continue
		}
		now := time.Now()
		p := v1.Progress{Step: step, BytesDone: done, BytesTotal: total}
		if step == lastStep && done >= lastDone {
			if secs := now.Sub(last).Seconds(); secs > 0 {
				p.RateBytesPerSecond = int64(float64(done-lastDone) / secs)
			}
		}
		lastStep, lastDone, last = step, done, now
		pctx, cancel := context.WithTimeout(ctx, min(every, callTimeout))
		err := post(pctx, p)
		cancel()
		if err != nil && ctx.Err() == nil {
			log.Debug("progress report not taken", "step", step, "bytes", done, "err", err)
		}
	}
}
