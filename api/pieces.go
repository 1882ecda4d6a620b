package api

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"

	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/state"
	"github.com/prometheus/client_golang/prometheus"
)

// peerAddrKey carries the piece listener address of the agent asking for
// a plan (PeerAddr).
type peerAddrKey struct{}

// PeerAddr returns the "host:port" at which the agent whose plan request
// ctx belongs to serves image pieces to its wave (its request's source
// address and the port it announced with v1.PeerPortQuery), or "" when it
// announced none. DeployPlanner implementations read it to name the agent
// to its wave.
func PeerAddr(ctx context.Context) string {
	s, _ := ctx.Value(peerAddrKey{}).(string)
	return s
}

// WithPeerAddr returns ctx carrying addr ("host:port") as the plan
// request's piece listener (PeerAddr); the API sets it, tests of planners
// use it.
func WithPeerAddr(ctx context.Context, addr string) context.Context {
	return context.WithValue(ctx, peerAddrKey{}, addr)
}

// withPeerAddr returns r's context carrying the agent's announced piece
// listener, when the port is a valid TCP port.
func withPeerAddr(r *http.Request) context.Context {
	p, err := strconv.Atoi(r.URL.Query().Get(v1.PeerPortQuery))
	if err != nil || p <= 0 || p > 65535 {
		return r.Context()
	}
	return WithPeerAddr(r.Context(), net.JoinHostPort(remoteIP(r), strconv.Itoa(p)))
}

// PieceMetrics counts where deployed image bytes came from, as the agents
// report it in done (v1.DeployResult.Pieces):
//
//   - machina_image_bytes_served_total{source="controller"|"peer"}: verified
//     piece bytes an agent fetched from the controller's image URL or from
//     its wave's peers;
//   - machina_image_bad_pieces_total: pieces a peer served that did not
//     match the manifest (one per dropped peer, as reported);
//   - machina_image_peers_dropped_total{reason="stalled"|"unreachable"}:
//     wave peers an agent stopped asking after one failed request
//     (v1.PieceStats.DroppedPeers).
//
// Safe for concurrent use; nil counts nothing.
type PieceMetrics struct {
	bytes   *prometheus.CounterVec
	bad     prometheus.Counter
	dropped *prometheus.CounterVec
}

// NewPieceMetrics registers the piece counters on reg.
func NewPieceMetrics(reg prometheus.Registerer) (*PieceMetrics, error) {
	m := &PieceMetrics{
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "machina_image_bytes_served_total", Help: "Verified image bytes deploying machines fetched, by source (controller or peer), as reported in done.",
		}, []string{"source"}),
		bad: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "machina_image_bad_pieces_total", Help: "Image pieces a wave peer served that did not match the piece manifest (the peer was dropped).",
		}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "machina_image_peers_dropped_total", Help: "Wave peers a deploying machine stopped asking for pieces after one failed request, by reason (stalled or unreachable), as reported in done.",
		}, []string{"reason"}),
	}
	for _, c := range []prometheus.Collector{m.bytes, m.bad, m.dropped} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register piece metrics: %w", err)
		}
	}
	m.bytes.WithLabelValues("controller")
	m.bytes.WithLabelValues("peer")
	m.dropped.WithLabelValues(v1.PeerStalled)
	m.dropped.WithLabelValues(v1.PeerUnreachable)
	return m, nil
}

// piecesTx writes one deploy.bad_piece event per bad peer and one
// deploy.peer_dropped event per stalled or unreachable peer a done reports
// (at most v1.MaxWavePeers of each: an agent asks no more), in the done's
// transaction.
func piecesTx(tx *state.Tx, server string, ps *v1.PieceStats) error {
	if ps == nil {
		return nil
	}
	for _, peer := range badPeers(ps) {
		if err := tx.AppendEvent(state.Event{Server: server, Kind: "deploy.bad_piece",
			Message: fmt.Sprintf("wave peer %s served an image piece that did not match the manifest; the agent dropped it and used nothing it sent", truncatePeer(peer))}); err != nil {
			return err
		}
	}
	for _, d := range droppedPeers(ps) {
		why := "did not answer in time (stalled)"
		if dropReason(d.Reason) == v1.PeerUnreachable {
			why = "could not be connected to (unreachable: refused, no route or connect timeout)"
		} else if dropReason(d.Reason) != v1.PeerStalled {
			why = "failed (reason " + truncatePeer(d.Reason) + ")"
		}
		if err := tx.AppendEvent(state.Event{Server: server, Kind: "deploy.peer_dropped",
			Message: fmt.Sprintf("wave peer %s %s; the agent asked it once and took its pieces from other peers or the controller", truncatePeer(d.Peer), why)}); err != nil {
			return err
		}
	}
	return nil
}

func badPeers(ps *v1.PieceStats) []string {
	if len(ps.BadPeers) > v1.MaxWavePeers {
		return ps.BadPeers[:v1.MaxWavePeers]
	}
	return ps.BadPeers
}

func droppedPeers(ps *v1.PieceStats) []v1.DroppedPeer {
	if len(ps.DroppedPeers) > v1.MaxWavePeers {
		return ps.DroppedPeers[:v1.MaxWavePeers]
	}
	return ps.DroppedPeers
}

// dropReason is r when it is a known v1.DroppedPeer reason, else "other"
// (an agent's string never becomes a metric label of its own).
func dropReason(r string) string {
	if r == v1.PeerStalled || r == v1.PeerUnreachable {
		return r
	}
	return "other"
}

// count adds a done's piece stats to the counters once the done was
// answered 204 (its transaction committed; a replayed answer runs no
// effect, so ps is nil then). Nil m counts nothing.
func (m *PieceMetrics) count(code int, ps *v1.PieceStats) {
	if m == nil || ps == nil || code != http.StatusNoContent {
		return
	}
	m.bytes.WithLabelValues("controller").Add(float64(max(ps.ControllerBytes, 0)))
	m.bytes.WithLabelValues("peer").Add(float64(max(ps.PeerBytes, 0)))
	m.bad.Add(float64(len(badPeers(ps))))
	for _, d := range droppedPeers(ps) {
		m.dropped.WithLabelValues(dropReason(d.Reason)).Inc()
	}
}

// truncatePeer keeps an agent-supplied peer URL printable and short.
func truncatePeer(s string) string {
	s = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return -1
		}
		return r
	}, s)
	if len(s) > 80 {
		s = s[:80]
	}
	return s
}
