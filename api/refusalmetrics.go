package api

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/machina-metal/machina/state"
)

var (
	descMachineRefusals = prometheus.NewDesc("machina_machine_refusals_total",
		"Machine requests with a known token (or a joined host's certificate) refused, by reason (state.RefusalReason); their events are paced (one at once, then one summary per interval).",
		[]string{"reason"}, nil)
	descHostAnomalies = prometheus.NewDesc("machina_host_anomalies_total",
		"Anomalies joined hosts' heartbeats reported, by event kind (host.rebooted, host.agent_restarted, host.fence_failed: a heartbeat while fenced); their events are paced per host and kind.",
		[]string{"kind"}, nil)
	descFenceNotHeld = prometheus.NewDesc("machina_hosts_fence_not_held",
		"Hosts that are fenced (power read back off) and heartbeat all the same: the fence did not hold (condition FenceFailed).",
		nil, nil)
)

// refusalCollector reads the store's refusal and anomaly counters, and
// the hosts whose fence did not hold, at scrape time.
type refusalCollector struct{ st *state.Store }

func (c refusalCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descMachineRefusals
	ch <- descHostAnomalies
	ch <- descFenceNotHeld
}

func (c refusalCollector) Collect(ch chan<- prometheus.Metric) {
	counts := c.st.RefusalCounts()
	for _, why := range state.RefusalReasons() {
		ch <- prometheus.MustNewConstMetric(descMachineRefusals, prometheus.CounterValue, float64(counts[why]), string(why))
	}
	kinds := c.st.AnomalyCounts()
	for _, k := range state.AnomalyKinds() {
		ch <- prometheus.MustNewConstMetric(descHostAnomalies, prometheus.CounterValue, float64(kinds[k]), string(k))
	}
	hosts, err := c.st.Hosts()
	if err != nil {
		ch <- prometheus.NewInvalidMetric(descFenceNotHeld, err)
		return
	}
	n := 0
	for _, h := range hosts {
		if h.Fenced != nil && h.FenceNotHeld != nil {
			n++
		}
	}
	ch <- prometheus.MustNewConstMetric(descFenceNotHeld, prometheus.GaugeValue, float64(n))
}
