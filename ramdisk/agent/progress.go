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
	retry       string
	at          time.Time     // of the last Set
	noted       chan struct{} // a new retry note, for ReportProgress
}

// Set records that step has done of total bytes done (WriteConfig.Progress).
// Bytes moved: a retry note (Retrying) is cleared.
func (m *ProgressMeter) Set(step string, done, total int64) {
	m.mu.Lock()
	m.step, m.done, m.total, m.retry = step, done, total, ""
	m.at = time.Now()
	m.mu.Unlock()
}

// Retrying notes that a request of the image download is failing and is
// asked again, and why (v1.Progress.Retry): ReportProgress posts it at
// once (as far as the controller's rate allows) and with every report
// until the next Set. Before any Set the step is the download's, at 0 of
// total bytes.
func (m *ProgressMeter) Retrying(msg string, total int64) {
	m.mu.Lock()
	if m.step == "" {
		m.step, m.total = v1.StepImageDownload, total
	}
	m.retry = msg
	ch := m.noted
	m.mu.Unlock()
	if ch != nil {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// Read returns the last Set; step is "" before one.
func (m *ProgressMeter) Read() (step string, done, total int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.step, m.done, m.total
}

// retryNote returns the note of Retrying, "" after a Set.
func (m *ProgressMeter) retryNote() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.retry
}

// movedAt returns when Set was last called (bytes last moved); zero
// before.
func (m *ProgressMeter) movedAt() time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.at
}

// notes returns the channel Retrying signals on, made on first use.
func (m *ProgressMeter) notes() <-chan struct{} {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.noted == nil {
		m.noted = make(chan struct{}, 1)
	}
	return m.noted
}

// ReportProgress posts what m says every every (v1.Plan.ProgressEvery)
// until ctx ends, with post (the AgentClient's Progress with the image
// token), starting one interval in, and at once when a retry is noted
// (ProgressMeter.Retrying; its note rides in v1.Progress.Retry). No two
// posts are closer than half an interval, the gap the controller takes
// them at: a note sooner than that goes with the next tick. The rate is
// the bytes done over the last interval of the same step. Each post is
// bounded by an interval (at most callTimeout); one that fails, or is
// refused (429 when the controller's clock runs ahead, 409 once the
// deploy is over), is logged and not retried: the next interval carries
// newer numbers, and a progress report never holds up the write. Nothing
// is posted before the first Set or Retrying. every <= 0 posts nothing.
func ReportProgress(ctx context.Context, every time.Duration, m *ProgressMeter, post func(context.Context, v1.Progress) error, log *slog.Logger) {
	if every <= 0 {
		return
	}
	t := time.NewTicker(every)
	defer t.Stop()
	noted := m.notes()
	var lastStep string
	var lastDone int64
	var lastPost time.Time
	last := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-noted:
		}
		step, done, total := m.Read()
		if step == "" || time.Since(lastPost) < every/2 {
			continue
		}
		now := time.Now()
		lastPost = now
		p := v1.Progress{Step: step, BytesDone: done, BytesTotal: total, Retry: m.retryNote()}
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
