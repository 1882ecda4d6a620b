package sim_test

import (
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/machina-metal/machina/lab/sim"
	"github.com/machina-metal/machina/state"
)

// pieceWave starts a generated site of 18 servers (six in zone-a) with a
// 24 MiB image (six 4 MiB pieces), every zone-a machine sharing pieces and
// its downloads from the controller paced at 2 MiB/s (the controller's
// uplink is the slow link, the peers' is not), edit applied to each zone-a
// machine; it raises the hypervisor count to 6 and waits until all six are
// deployed, booted from disk and verified (the controller matched the
// agent's digest and read-back digest against the plan).
func pieceWave(t *testing.T, edit func(*sim.Machine)) (*rig, []string) {
	t.Helper()
	var zoneA []string
	r := startRig(t, rigOptions{lab: sim.Config{Servers: 18, ImageBytes: 24 << 20}, before: func(l *sim.Lab) {
		for _, m := range l.Machines() {
			if m.HW.Product == "SimServer 1U" { // zone-a's hardware
				zoneA = append(zoneA, m.Name)
				m.SharePieces(true)
				m.ThrottleImages(2 << 20)
				if edit != nil {
					edit(m)
				}
			}
		}
	}})
	if len(zoneA) != 6 {
		t.Fatalf("zone-a has %d machines, want 6", len(zoneA))
	}
	r.commit("hypervisor count 6", func(dir string) { r.setCount(dir, "hypervisor", 6) })
	snap := r.waitFor("six hypervisors deployed", 4*time.Minute, func(s state.Snapshot) bool { return deployedBy(s, "hypervisor") == 6 })
	for _, name := range zoneA {
		srv := record(snap, name)
		if srv.Lifecycle != state.LifecycleDeployed || srv.Deploy == nil || !srv.Deploy.Verified {
			t.Errorf("%s: %s, deploy %+v; want deployed and verified", name, srv.Lifecycle, srv.Deploy)
		}
		r.waitMachine(r.lab.Machine(name), sim.PhaseOS) // boots the written OS (its marker is at byte 0)
	}
	return r, zoneA
}

// metricValue reads one sample of the controller's /metrics.
func (r *rig) metricValue(name string) float64 {
	r.t.Helper()
	code, body := r.admin("GET", "/metrics", nil)
	if code != 200 {
		r.t.Fatalf("GET /metrics = %d", code)
	}
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + ` (\S+)$`).FindSubmatch(body)
	if m == nil {
		r.t.Fatalf("/metrics lacks %s", name)
	}
	v, err := strconv.ParseFloat(string(m[1]), 64)
	if err != nil {
		r.t.Fatal(err)
	}
	return v
}

// TestWaveSharesImagePieces: six machines of one profile deploy one image
// with piece sharing on. The controller's image responses (counted on the
// lab's network) total less than six images, the peers supplied the rest,
// and every machine verified its image.
func TestWaveSharesImagePieces(t *testing.T) {
	r, _ := pieceWave(t, nil)
	const image = 24 << 20
	fromController := r.lab.ImageBytesFromController()
	if fromController >= 6*image {
		t.Errorf("controller served %d bytes to six machines, want less than six images (%d)", fromController, 6*image)
	}
	peer := r.metricValue(`machina_image_bytes_served_total{source="peer"}`)
	ctrl := r.metricValue(`machina_image_bytes_served_total{source="controller"}`)
	if peer <= 0 || ctrl+peer < 6*image {
		t.Errorf("agents reported %v bytes from the controller and %v from peers, want peers > 0 and six images in all", ctrl, peer)
	}
	if bad := r.metricValue("machina_image_bad_pieces_total"); bad != 0 {
		t.Errorf("machina_image_bad_pieces_total = %v with honest peers", bad)
	}
	t.Logf("six 24 MiB deploys: the controller served %.1f MiB (%.2f images), agents reported %.1f MiB from peers",
		float64(fromController)/(1<<20), float64(fromController)/image, peer/(1<<20))
}

// TestWaveRefusesBadPieces: every zone-a machine's piece listener flips a
// byte of each piece it serves. Each member that asks a peer finds the
// piece's SHA-256 wrong, drops the peer, uses nothing it sent and fetches
// from the controller; the bad peers are reported (deploy.bad_piece
// events, machina_image_bad_pieces_total) and all six machines deploy
// their verified image.
func TestWaveRefusesBadPieces(t *testing.T) {
	r, zoneA := pieceWave(t, func(m *sim.Machine) { m.ServeBadPieces(true) })
	if bad := r.metricValue("machina_image_bad_pieces_total"); bad < 1 {
		t.Errorf("machina_image_bad_pieces_total = %v, want at least 1", bad)
	}
	if peer := r.metricValue(`machina_image_bytes_served_total{source="peer"}`); peer != 0 {
		t.Errorf("agents used %v bytes from peers that all serve bad pieces", peer)
	}
	events := 0
	for _, name := range zoneA {
		for _, ev := range r.events(name, 0) {
			if ev.Kind == "deploy.bad_piece" {
				events++
				if !strings.Contains(ev.Message, "did not match the manifest") {
					t.Errorf("%s: event %q", name, ev.Message)
				}
			}
		}
	}
	if events == 0 {
		t.Error("no deploy.bad_piece event")
	}
}
