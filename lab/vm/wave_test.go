package vm

import (
	"bytes"
	"log/slog"
	"testing"
)

// TestWaveJoinedLine: waveShared finds the machine and wave of the
// planner's "deploy wave joined" line as `machina serve --log-format text`
// writes it (the planner's logger carries component=planner), and reads a
// labelled sample of the Prometheus text format.
func TestWaveJoinedLine(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil)).With("component", "planner")
	log.Info("deploy wave joined", "machine", "vm-ipmi", "wave", "lab-0123456789ab-1", "peers", 1)
	m := waveJoined.FindStringSubmatch(buf.String())
	if m == nil || m[1] != "vm-ipmi" || m[2] != "lab-0123456789ab-1" {
		t.Fatalf("line %q: match %q", buf.String(), m)
	}
	v, err := metricValue("# TYPE x counter\nmachina_image_bytes_served_total{source=\"peer\"} 1.073741824e+09\n", `machina_image_bytes_served_total{source="peer"}`)
	if err != nil || v != 1<<30 {
		t.Fatalf("metric: %v %v", v, err)
	}
}
