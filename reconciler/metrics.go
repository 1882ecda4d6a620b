package reconciler

import (
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/machina-metal/machina/bmc"
	"github.com/machina-metal/machina/reconciler/plan"
	"github.com/machina-metal/machina/state"
)

// Metrics are the controller's Prometheus metrics. Register them with
// NewMetrics on the registry the admin API's /metrics serves.
// Servers by lifecycle are the admin API's machina_servers gauge.
type Metrics struct {
	actions  *prometheus.CounterVec
	duration prometheus.Histogram
}

// NewMetrics creates the metrics and registers them on reg:
// machina_actions_total{action,result} and machina_reconcile_duration_seconds.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		actions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "machina_actions_total", Help: "Executor actions by action and result (ok, transient, failed, interrupted: cut off by the controller stopping)."}, []string{"action", "result"}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "machina_reconcile_duration_seconds", Help: "Time to snapshot and plan one pass.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 14)}),
	}
	if reg != nil {
		reg.MustRegister(m.actions, m.duration)
	}
	return m
}

func (m *Metrics) observePass(_ state.Snapshot, d time.Duration) {
	m.duration.Observe(d.Seconds())
}

func (m *Metrics) observeAction(a plan.Action, err error, interrupted bool) {
	result := "ok"
	switch {
	case err == nil:
	case interrupted:
		result = "interrupted"
	case bmc.IsTransient(err) || errors.Is(err, bmc.ErrUnreachable):
		result = "transient"
	default:
		result = "failed"
	}
	m.actions.WithLabelValues(string(a), result).Inc()
}
