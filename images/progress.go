package images

import "time"

// Phase names the step of an import a [Progress] report belongs to.
type Phase string

// Import phases, in order. PhaseResume re-hashes the bytes of a partial
// download left by an earlier run before the transfer continues.
const (
	PhaseResume   Phase = "resume"
	PhaseDownload Phase = "download"
	PhaseConvert  Phase = "convert"
	PhaseHash     Phase = "hash"
)

// Progress is one progress report. Bytes and Total are in bytes (Total is -1
// when the server sent no length; for PhaseConvert they count raw bytes
// written of the virtual size). Rate is bytes per second, smoothed; ETA is -1 when
// unknown. Done marks the last report of a phase.
type Progress struct {
	Image string
	Phase Phase
	Bytes int64
	Total int64
	Rate  float64
	ETA   time.Duration
	Done  bool
}

// Percent returns completion in [0,100], or -1 when Total is unknown.
func (p Progress) Percent() float64 {
	if p.Total <= 0 {
		return -1
	}
	return 100 * float64(p.Bytes) / float64(p.Total)
}

// progressMeter turns byte counts into throttled [Progress] reports.
type progressMeter struct {
	image    string
	phase    Phase
	fn       func(Progress)
	percent  func(float64) // status hook, called on whole-percent changes
	interval time.Duration
	now      func() time.Time

	total   int64
	lastT   time.Time
	lastB   int64
	rate    float64
	lastPct int
}

func newProgressMeter(image string, phase Phase, fn func(Progress), percent func(float64), interval time.Duration) *progressMeter {
	t := time.Now()
	return &progressMeter{image: image, phase: phase, fn: fn, percent: percent, interval: interval,
		now: time.Now, total: -1, lastT: t, lastPct: -1}
}

func (m *progressMeter) setTotal(n int64) { m.total = n }

// update records that b bytes are done; it reports at most once per interval.
func (m *progressMeter) update(b int64) {
	t := m.now()
	dt := t.Sub(m.lastT)
	if dt < m.interval && b != m.total {
		return
	}
	if dt > 0 && b >= m.lastB {
		inst := float64(b-m.lastB) / dt.Seconds()
		if m.rate == 0 {
			m.rate = inst
		} else {
			m.rate = 0.7*m.rate + 0.3*inst
		}
	}
	m.lastT, m.lastB = t, b
	m.emit(b, false)
}

// finish sends the phase's last report.
func (m *progressMeter) finish(b int64) {
	if m.total < 0 {
		m.total = b
	}
	m.emit(b, true)
}

func (m *progressMeter) emit(b int64, done bool) {
	p := Progress{Image: m.image, Phase: m.phase, Bytes: b, Total: m.total, Rate: m.rate, ETA: -1, Done: done}
	if m.total >= 0 && m.rate > 0 {
		p.ETA = time.Duration(float64(m.total-b) / m.rate * float64(time.Second))
	}
	if m.fn != nil {
		m.fn(p)
	}
	if m.percent != nil && m.total > 0 {
		if pct := int(100 * b / m.total); pct != m.lastPct {
			m.lastPct = pct
			m.percent(float64(pct))
		}
	}
}
