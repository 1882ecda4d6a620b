package api

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/machina-metal/machina/state"
)

var descMachineRefusals = prometheus.NewDesc("machina_machine_refusals_total",
	"Machine requests with a known token refused, by reason (state.RefusalReason); their events are paced (one at once, then one summary per interval).",
	[]string{"reason"}, nil)

// refusalCollector reads the store's refusal counters at scrape time.
type refusalCollector struct{ st *state.Store }

func (c refusalCollector) Describe(ch chan<- *prometheus.Desc) { ch <- descMachineRefusals }

func (c refusalCollector) Collect(ch chan<- prometheus.Metric) {
	counts := c.st.RefusalCounts()
	for _, why := range state.RefusalReasons() {
		ch <- prometheus.MustNewConstMetric(descMachineRefusals, prometheus.CounterValue, float64(counts[why]), string(why))
	}
}
