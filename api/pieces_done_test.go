package api_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/machina-metal/machina/api"
	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/state"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestDonePieceStats: a done's piece stats are counted once
// (machina_image_bytes_served_total{source}, machina_image_bad_pieces_total,
// machina_image_peers_dropped_total{reason}), even when the agent's retry
// of the same done is answered again; each bad peer it names is written as
// a deploy.bad_piece event, and each stalled or unreachable peer as a
// deploy.peer_dropped event saying why.
func TestDonePieceStats(t *testing.T) {
	f := newFixture(t, state.Options{})
	reg := prometheus.NewRegistry()
	pm, err := api.NewPieceMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	m, err := api.NewMachine(api.MachineConfig{Store: f.store, Planner: &flakyPlanner{}, Pieces: pm})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Mount(f.api); err != nil {
		t.Fatal(err)
	}
	if _, err := f.store.CreateServer(state.Server{Name: "r1-n07", BootMAC: onceMAC}); err != nil {
		t.Fatal(err)
	}
	walk(t, f, state.LifecycleCommissioning, state.LifecycleReady, state.LifecycleAllocated, state.LifecycleDeploying)
	var p v1.Plan
	_, _, b := f.do(t, http.MethodGet, v1.PathAgentPlan, issueFor(t, f, state.PurposePlan), "")
	if err := json.Unmarshal(b, &p); err != nil {
		t.Fatal(err)
	}
	want := strings.Repeat("ab", 32)
	res := v1.DeployResult{BootMAC: onceMAC, OK: true, BytesWritten: 4 << 20, SHA256: want, ReadBackSHA256: want,
		Pieces: &v1.PieceStats{ControllerBytes: 1 << 20, PeerBytes: 3 << 20, BadPeers: []string{"http://10.0.0.9:7480"},
			DroppedPeers: []v1.DroppedPeer{{Peer: "http://10.0.0.10:7480", Reason: v1.PeerUnreachable}, {Peer: "http://10.0.0.11:7480", Reason: v1.PeerStalled}}}}
	for range 2 { // the second is the agent's retry: the same answer, no second count
		if code, _, b := f.do(t, http.MethodPost, v1.PathAgentDone, p.DoneToken, mustJSON(t, res)); code != http.StatusNoContent {
			t.Fatalf("done: %d %s", code, b)
		}
	}
	const exp = `
# HELP machina_image_bad_pieces_total Image pieces a wave peer served that did not match the piece manifest (the peer was dropped).
# TYPE machina_image_bad_pieces_total counter
machina_image_bad_pieces_total 1
# HELP machina_image_bytes_served_total Verified image bytes deploying machines fetched, by source (controller or peer), as reported in done.
# TYPE machina_image_bytes_served_total counter
machina_image_bytes_served_total{source="controller"} 1.048576e+06
machina_image_bytes_served_total{source="peer"} 3.145728e+06
# HELP machina_image_peers_dropped_total Wave peers a deploying machine stopped asking for pieces after one failed request, by reason (stalled or unreachable), as reported in done.
# TYPE machina_image_peers_dropped_total counter
machina_image_peers_dropped_total{reason="stalled"} 1
machina_image_peers_dropped_total{reason="unreachable"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(exp)); err != nil {
		t.Error(err)
	}
	evs, err := f.store.Events(state.EventQuery{Server: "r1-n07"})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	dropped := map[string]string{}
	for _, ev := range evs {
		if ev.Kind == "deploy.peer_dropped" {
			for _, peer := range []string{"http://10.0.0.10:7480", "http://10.0.0.11:7480"} {
				if strings.Contains(ev.Message, peer) {
					dropped[peer] = ev.Message
				}
			}
		}
		if ev.Kind == "deploy.bad_piece" {
			n++
			if !strings.Contains(ev.Message, "http://10.0.0.9:7480") {
				t.Errorf("event %q does not name the peer", ev.Message)
			}
		}
	}
	if n != 1 {
		t.Errorf("%d deploy.bad_piece events, want 1", n)
	}
	if !strings.Contains(dropped["http://10.0.0.10:7480"], "unreachable") || !strings.Contains(dropped["http://10.0.0.11:7480"], "stalled") {
		t.Errorf("deploy.peer_dropped events by peer: %q, want the unreachable and the stalled peer with their reasons", dropped)
	}
}
