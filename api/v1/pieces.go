package v1

import (
	"context"
	"net/http"
	"strconv"
)

// PieceBytes is the piece size of an image's piece manifest: 4 MiB. It
// matches the agent's write chunk (WriteConfig.ChunkBytes' default), keeps
// the manifest of a 2 GiB image at 512 hashes (about 33 KiB of hex, small
// enough to travel inline in the Plan), and is large enough that a piece's
// HTTP request overhead is under 0.1% of its bytes on a 1 Gbit/s link.
const PieceBytes = 4 << 20

// PieceManifest lists the SHA-256 of every PieceBytes piece of a raw
// image, so a machine can check each piece it gets from a peer before it
// uses it. The last piece may be short. The manifest is made by the
// controller from its verified image; the whole-image digest is still
// checked before a byte reaches the disk.
type PieceManifest struct {
	// PieceBytes is the size of every piece but the last (PieceBytes).
	PieceBytes int64 `json:"pieceBytes"`
	// SizeBytes and SHA256 are the whole image's size and lower-case hex
	// digest (the Plan's ImageSizeBytes and ImageSHA256).
	SizeBytes int64  `json:"sizeBytes"`
	SHA256    string `json:"sha256"`
	// Pieces holds the lower-case hex SHA-256 of piece i at index i;
	// ceil(SizeBytes/PieceBytes) entries.
	Pieces []string `json:"pieces"`
}

// Wave is the part of a Plan that lets machines deploying the same image
// in the same zone share its pieces. Nil (or no Peers) means the agent
// fetches everything from ImageURL.
type Wave struct {
	// ID names the wave in the controller's events and metrics.
	ID string `json:"id"`
	// Token is the wave's shared secret: the agent serves pieces only to
	// requests carrying it (Authorization: Bearer), and presents it to
	// peers. It is derived per image digest, zone and wave, so a machine
	// planned for another image or zone never holds it. It is never a
	// controller admin or machine token.
	Token string `json:"token"`
	// Peers are base URLs ("http://10.0.0.5:7480") of at most MaxWavePeers
	// other members that hold or are fetching the image.
	Peers []string `json:"peers,omitempty"`
}

// MaxWavePeers bounds Wave.Peers: each agent asks at most this many peers,
// so one popular peer's load stays bounded too.
const MaxWavePeers = 4

// PeerPiecePath is where an agent's piece listener serves piece i of the
// wave's image: GET PeerPiecePath + "<sha256>/<i>" with the wave token.
// It answers 404 for a piece it does not hold yet and 403 for a wrong
// token or image.
const PeerPiecePath = "/v1/pieces/"

// PeerPortQuery is the query parameter of PathAgentPlan through which an
// agent announces the TCP port of its piece listener; the controller pairs
// it with the request's source address to name the agent to its wave.
const PeerPortQuery = "peerPort"

// PieceStats is what a deploy's pieces came from, reported in done.
type PieceStats struct {
	// ControllerBytes and PeerBytes count the verified piece bytes fetched
	// from the controller's ImageURL and from peers.
	ControllerBytes int64 `json:"controllerBytes"`
	PeerBytes       int64 `json:"peerBytes"`
	// BadPeers are the peers that served a piece whose SHA-256 differed
	// from the manifest; each was dropped for the rest of the deploy.
	BadPeers []string `json:"badPeers,omitempty"`
	// DroppedPeers are the other peers the agent stopped asking during
	// the deploy, each asked no more after its first failure, and why.
	// Sent only to a controller whose Plan carries SilentAfter (an older
	// one refuses unknown fields in done).
	DroppedPeers []DroppedPeer `json:"droppedPeers,omitempty"`
}

// DroppedPeer is a wave peer the agent stopped asking, and why.
type DroppedPeer struct {
	// Peer is the peer's base URL as the Wave named it.
	Peer string `json:"peer"`
	// Reason is PeerStalled or PeerUnreachable.
	Reason string `json:"reason"`
}

// Reasons of DroppedPeer.
const (
	// PeerStalled: the peer's response delivered no bytes for the stall
	// timeout, or did not end within the peer timeout.
	PeerStalled = "stalled"
	// PeerUnreachable: the connection to the peer failed (refused, no
	// route to the host or network, connect timeout): a machine that
	// left the wave, rebooted, or whose piece port is filtered.
	PeerUnreachable = "unreachable"
)

// PlanWithPeer fetches the deploy plan like Plan, announcing that this
// agent serves pieces on TCP port peerPort of the address it calls from
// (PeerPortQuery); peerPort 0 is Plan.
func (c *AgentClient) PlanWithPeer(ctx context.Context, token string, peerPort int) (Plan, error) {
	if peerPort <= 0 {
		return c.Plan(ctx, token)
	}
	var p Plan
	err := c.do(ctx, "get plan", http.MethodGet, c.URL(PathAgentPlan)+"?"+PeerPortQuery+"="+strconv.Itoa(peerPort), token, nil, &p)
	return p, err
}

// DefaultPeerPort is the TCP port the ramdisk agent serves pieces on
// (cmd/machina-agent): machines of one zone must reach each other on it
// over the provisioning network.
const DefaultPeerPort = 7480
