package state

import (
	"fmt"
	"maps"
	"time"
)

// Machine-reported anomalies: what a joined host's heartbeat says about
// itself (a reboot, an agent restart, a heartbeat while fenced). A host
// that lies, loops or is broken can report one on every heartbeat (an
// uptime that goes backwards each time is a "reboot" each time), so their
// events are paced like refused requests (refusals.go): per host and
// kind, the first of a quiet interval is written with the heartbeat, the
// rest are counted and summarised in one event at the interval's end
// (Options.RefusalSummaryEvery, one minute). AnomalyCounts counts them
// all.

// anomalySummary is the anomaly pacer's summary message.
func anomalySummary(k refusalKey, w *refusalWindow, every time.Duration) string {
	return fmt.Sprintf("host %s: %d more %s reported by its heartbeats within %s (one event per host and kind per interval); last at %s: %s",
		k.host, w.n, k.kind, every, w.lastAt.Format(time.RFC3339), w.last)
}

// AnomalyCounts returns how many machine-reported anomalies were seen per
// event kind (EventHostRebooted, EventHostAgentRestarted,
// EventHostFenceFailed for each heartbeat of a fenced host) since the
// store was opened, written or summarised alike.
func (s *Store) AnomalyCounts() map[EventKind]int64 {
	p := &s.anomalies
	p.mu.Lock()
	defer p.mu.Unlock()
	return maps.Clone(p.kinds)
}

// AnomalyKinds lists the event kinds AnomalyCounts counts, for metrics.
func AnomalyKinds() []EventKind {
	return []EventKind{EventHostRebooted, EventHostAgentRestarted, EventHostFenceFailed}
}

// FlushAnomalies writes the summary events of the anomalies counted since
// the last ones were written, now, and ends the current interval. Close
// calls it; tests call it instead of waiting for the interval.
func (s *Store) FlushAnomalies() error {
	return s.flushPacer(&s.anomalies)
}

// countAnomaly counts one anomaly of kind (AnomalyCounts).
func (s *Store) countAnomaly(kind EventKind) {
	p := &s.anomalies
	p.mu.Lock()
	if p.kinds == nil {
		p.kinds = map[EventKind]int64{}
	}
	p.kinds[kind]++
	p.mu.Unlock()
}

// pacedAnomaly is an anomaly event a transaction decided on: written with
// it (the key was quiet) or left to the key's summary.
type pacedAnomaly struct {
	key     refusalKey
	message string
	written bool
}

// settleAnomalies accounts, after the transaction committed, for the
// anomalies it decided on: a written one opens its key's window, a held
// one is counted into it.
func (s *Store) settleAnomalies(as []pacedAnomaly) {
	for _, a := range as {
		s.countAnomaly(a.key.kind)
		s.pace(&s.anomalies, a.key, "", a.message, a.written)
	}
}
