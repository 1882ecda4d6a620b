package controller

import (
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/machina-metal/machina/boot/ipxe"
	"github.com/machina-metal/machina/state"
)

// TestRefusalSummary: 2,000 refused boot requests (a bounded flood) write
// one summary event per interval, not 2,000 events (before the fix every
// 429 appended an event, with its fsync); the metric counts them all; a
// discovery still gets its own event.
func TestRefusalSummary(t *testing.T) {
	st, err := state.Open(filepath.Join(t.TempDir(), "state.db"), state.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	reg := prometheus.NewRegistry()
	r, err := newRefusalSummary(st, reg)
	if err != nil {
		t.Fatal(err)
	}
	before, _ := st.Events(state.EventQuery{Limit: 10000})
	ip := netip.MustParseAddr("10.0.0.9")
	for i := range 2000 {
		kind := ipxe.EventRateLimited
		if i%10 == 0 {
			kind = ipxe.EventTokenRejected
		}
		r.event(ipxe.Event{Kind: kind, MAC: "52:54:00:00:00:09", IP: ip, Reason: "per-ip"})
	}
	r.event(ipxe.Event{Kind: ipxe.EventDiscovered, MAC: "52:54:00:00:00:0a", IP: ip})
	r.flush(time.Minute)
	r.flush(time.Minute) // nothing new: no event
	after, _ := st.Events(state.EventQuery{Limit: 10000})
	added := after[len(before):]
	if len(added) != 2 {
		t.Fatalf("%d events for 2,000 refusals and a discovery, want 2: %+v", len(added), added)
	}
	sum := added[1]
	if sum.Kind != "boot.refused" || !strings.Contains(sum.Message, "rate-limited 1800") || !strings.Contains(sum.Message, "token-rejected 200") {
		t.Errorf("summary event = %+v", sum)
	}
	mfs, _ := reg.Gather()
	total := 0.0
	for _, mf := range mfs {
		if mf.GetName() == "machina_boot_refusals_total" {
			for _, m := range mf.GetMetric() {
				total += m.GetCounter().GetValue()
			}
		}
	}
	if total != 2000 {
		t.Errorf("machina_boot_refusals_total = %v, want 2000", total)
	}
}
