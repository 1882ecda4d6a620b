package deployplan

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"sync"

	"github.com/machina-metal/machina/api"
	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/images"
	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/state"
)

// Waves groups the machines deploying the same image in the same zone into
// a wave whose members share the image's pieces (v1.Wave), so the
// controller's uplink sends an image about once per wave instead of once
// per machine. A wave lasts while any member is still deploying; the next
// deploy of that image in that zone starts a new wave with a new token.
//
// Each member is told the (at most v1.MaxWavePeers) most recent members
// that joined before it: they hold or are fetching the image, and because
// a member only ever waits on earlier members the waits form no cycle.
// Peers never cross zones (the zone is part of the wave's identity)
// unless the profile says shareAcrossZones: its machines then form one
// wave per image whatever their zones.
//
// The wave token is an HMAC-SHA256, under a key drawn at NewWaves and held
// only in memory, of the zone, image digest and wave generation: a machine
// planned for another image or zone, or a later wave, never holds it, and
// it is none of the controller's stored tokens. A controller restart or
// failover forgets the waves; later plans start new ones. Safe for
// concurrent use.
type Waves struct {
	key      []byte
	mu       sync.Mutex
	waves    map[string]*wave
	building map[string]bool // images whose manifest is being made
}

type wave struct {
	gen     int
	members []waveMember
}

type waveMember struct {
	server, url string
}

// NewWaves returns an empty wave registry with a fresh key.
func NewWaves() *Waves {
	k := make([]byte, 32)
	rand.Read(k)
	return &Waves{key: k, waves: map[string]*wave{}, building: map[string]bool{}}
}

// build makes image's manifest in the background with hash, unless a
// build of it is already running.
func (w *Waves) build(image string, hash func(string) (images.Manifest, error), log *slog.Logger) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.building[image] {
		return
	}
	w.building[image] = true
	go func() {
		_, err := hash(image)
		if err != nil && log != nil {
			log.Warn("piece manifest not made; plans fall back to whole-image fetches", "image", image, "err", err)
		}
		w.mu.Lock()
		delete(w.building, image)
		w.mu.Unlock()
	}()
}

// join adds server (serving pieces at url) to the wave of zone and image
// digest sha256, first dropping members alive reports as no longer
// deploying, and returns the wave for server's plan.
func (w *Waves) join(zone, sha string, server, url string, alive func(string) bool) v1.Wave {
	key := zone + "/" + sha
	w.mu.Lock()
	defer w.mu.Unlock()
	wv := w.waves[key]
	if wv == nil {
		wv = &wave{}
		w.waves[key] = wv
	}
	kept := wv.members[:0]
	for _, m := range wv.members {
		if m.server == server || alive(m.server) {
			kept = append(kept, m)
		}
	}
	wv.members = kept
	if len(wv.members) == 0 {
		wv.gen++ // nobody of the last wave is deploying: a new wave
	}
	pos := -1
	for i, m := range wv.members {
		if m.server == server {
			pos = i
			wv.members[i].url = url // a retried plan from a restarted agent
		}
	}
	if pos < 0 {
		wv.members = append(wv.members, waveMember{server: server, url: url})
		pos = len(wv.members) - 1
	}
	id := fmt.Sprintf("%s-%s-%d", zone, sha[:12], wv.gen)
	mac := hmac.New(sha256.New, w.key)
	mac.Write([]byte(id))
	out := v1.Wave{ID: id, Token: hex.EncodeToString(mac.Sum(nil))}
	for i := pos - 1; i >= 0 && len(out.Peers) < v1.MaxWavePeers; i-- {
		out.Peers = append(out.Peers, "http://"+wv.members[i].url)
	}
	return out
}

// addPieces puts the image's piece manifest and the machine's wave into
// plan when the agent announced a piece listener (api.PeerAddr). A manifest that
// cannot be made leaves the plan as it was (the agent fetches the whole
// image), with a warning.
func (p *Planner) addPieces(ctx context.Context, srv state.Server, prof inventory.Profile, image string, plan *v1.Plan) {
	// Only an agent that announced a piece listener knows the plan's
	// Pieces and Wave fields (an older ramdisk decodes plans strictly).
	addr := api.PeerAddr(ctx)
	if p.Waves == nil || addr == "" {
		return
	}
	m, ok := p.Images.CachedManifest(image)
	if !ok {
		// An image imported before manifests existed: hash it in the
		// background (once at a time) and plan this machine without.
		p.Waves.build(image, p.Images.Manifest, p.Logger)
		return
	}
	plan.Pieces = &v1.PieceManifest{PieceBytes: m.PieceBytes, SizeBytes: m.SizeBytes, SHA256: m.Raw.Hex, Pieces: m.Pieces}
	alive := func(name string) bool {
		if p.Store == nil {
			return true
		}
		s, err := p.Store.Server(name)
		return err == nil && s.Lifecycle == state.LifecycleDeploying
	}
	zone := srv.Zone
	if prof.ShareAcrossZones {
		zone = "profile:" + prof.Name // one wave per image for the profile, over its zones
	}
	wv := p.Waves.join(zone, m.Raw.Hex, srv.Name, addr, alive)
	plan.Wave = &wv
	if p.Logger != nil {
		p.Logger.Info("deploy wave joined", "machine", srv.Name, "wave", wv.ID, "peers", len(wv.Peers))
	}
}
