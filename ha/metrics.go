package ha

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the HA metrics of one controller. A nil *Metrics records
// nothing.
type Metrics struct {
	leader    prometheus.Gauge
	elections prometheus.Counter
	stepdowns *prometheus.CounterVec
}

// NewMetrics creates the metrics and registers them on reg (nil: not
// registered): machina_ha_leader (1 while this controller leads, else 0),
// machina_ha_elections_total (terms won) and
// machina_ha_stepdowns_total{reason} (terms ended, by reason:
// unreachable, lease_lost, key_gone, resigned, shutdown).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		leader:    prometheus.NewGauge(prometheus.GaugeOpts{Name: "machina_ha_leader", Help: "1 while this controller is the leader, else 0."}),
		elections: prometheus.NewCounter(prometheus.CounterOpts{Name: "machina_ha_elections_total", Help: "Leader elections this controller won."}),
		stepdowns: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "machina_ha_stepdowns_total", Help: "Leadership terms of this controller that ended, by reason."}, []string{"reason"}),
	}
	for _, r := range []string{"unreachable", "lease_lost", "key_gone", "resigned", "shutdown"} {
		m.stepdowns.WithLabelValues(r)
	}
	if reg != nil {
		reg.MustRegister(m.leader, m.elections, m.stepdowns)
	}
	return m
}

func (m *Metrics) setLeader(v bool) {
	if m == nil {
		return
	}
	if v {
		m.leader.Set(1)
	} else {
		m.leader.Set(0)
	}
}

func (m *Metrics) elected() {
	if m != nil {
		m.elections.Inc()
	}
}

func (m *Metrics) steppedDown(reason error) {
	if m != nil {
		m.stepdowns.WithLabelValues(reasonLabel(reason)).Inc()
	}
}

// reasonLabel maps a term's end reason to its metric label.
func reasonLabel(err error) string {
	switch {
	case errors.Is(err, ErrShutdown):
		return "shutdown"
	case errors.Is(err, ErrUnreachable):
		return "unreachable"
	case errors.Is(err, ErrLeaseLost):
		return "lease_lost"
	case errors.Is(err, ErrKeyGone):
		return "key_gone"
	default:
		return "resigned"
	}
}
