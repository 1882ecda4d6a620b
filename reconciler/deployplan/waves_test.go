package deployplan

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/machina-metal/machina/api"
	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/images"
	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/state"
)

// TestWavesPeersTokensAndZones: members of one zone and image get the same
// token and at most four earlier members as peers; another zone or image
// gets another token and never a peer across; once no member is deploying
// the next deploy starts a new wave with a new token.
func TestWavesPeersTokensAndZones(t *testing.T) {
	w := NewWaves()
	img := strings.Repeat("a", 64)
	other := strings.Repeat("b", 64)
	deploying := map[string]bool{}
	alive := func(s string) bool { return deploying[s] }
	var first string
	for i, name := range []string{"n1", "n2", "n3", "n4", "n5", "n6"} {
		deploying[name] = true
		wv := w.join("zone-a", img, name, name+":7480", alive)
		if i == 0 {
			first = wv.Token
		}
		if wv.Token != first || len(wv.Token) != 64 {
			t.Errorf("%s: token %q, want the wave's %q", name, wv.Token, first)
		}
		if want := min(i, 4); len(wv.Peers) != want {
			t.Errorf("%s: %d peers %v, want %d", name, len(wv.Peers), wv.Peers, want)
		}
		for _, p := range wv.Peers {
			if p == "http://"+name+":7480" {
				t.Errorf("%s is its own peer", name)
			}
		}
	}
	if wv := w.join("zone-a", img, "n6", "n6:7481", alive); len(wv.Peers) != 4 || wv.Peers[0] != "http://n5:7480" {
		t.Errorf("retried plan of n6: peers %v, want the four before it, n5 first", wv.Peers)
	}
	deploying["b1"], deploying["c1"] = true, true
	if wv := w.join("zone-b", img, "b1", "b1:7480", alive); wv.Token == first || len(wv.Peers) != 0 {
		t.Errorf("zone-b member: token same as zone-a's %v, peers %v; want another token and no peers across zones", wv.Token == first, wv.Peers)
	}
	if wv := w.join("zone-a", other, "c1", "c1:7480", alive); wv.Token == first || len(wv.Peers) != 0 {
		t.Errorf("other image: token same %v, peers %v; want another token and no peers", wv.Token == first, wv.Peers)
	}
	clear(deploying)
	deploying["n7"] = true
	if wv := w.join("zone-a", img, "n7", "n7:7480", alive); wv.Token == first || len(wv.Peers) != 0 {
		t.Errorf("after the wave ended: token same %v, peers %v; want a new wave", wv.Token == first, wv.Peers)
	}
	if NewWaves().join("zone-a", img, "n1", "n1:7480", alive).Token == first {
		t.Error("another controller's key made the same token")
	}
}

// TestDeployPlanPiecesAndWave: a plan carries no pieces or wave for an
// agent that announced no piece listener; for one that did, an image whose
// manifest is not made yet is planned whole while the manifest is made in
// the background; once it is, plans carry the manifest (matching the blob)
// and the wave, the second machine naming the first as its peer.
func TestDeployPlanPiecesAndWave(t *testing.T) {
	res, err := inventory.Load(os.DirFS("../../inventory-example"), inventory.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	inv := res.Inventory
	dir := t.TempDir()
	store, err := images.OpenStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	blob := make([]byte, images.PieceBytes+100)
	rand.Read(blob)
	sum := sha256.Sum256(blob)
	raw := images.Digest{Algo: "sha256", Hex: hex.EncodeToString(sum[:])}
	bp, _ := store.BlobPath(raw)
	if err := os.WriteFile(bp, blob, 0o444); err != nil {
		t.Fatal(err)
	}
	rec := images.Record{Name: "ubuntu-24.04", Source: "http://mirror.invalid/u.img", State: images.StateVerified, SizeBytes: int64(len(blob)), Raw: raw}
	b, _ := json.Marshal(rec)
	if err := os.WriteFile(filepath.Join(dir, "images", "ubuntu-24.04.json"), b, 0o640); err != nil {
		t.Fatal(err)
	}
	p := &Planner{Desired: func() *inventory.Inventory { return inv }, Images: store, BaseURL: "http://10.99.0.1:8080", Join: fixedJoin{}, Waves: NewWaves()}
	srv := func(name string) state.Server {
		return state.Server{Name: name, Zone: "zone-a", Lifecycle: state.LifecycleDeploying,
			Allocation: &state.Allocation{Profile: "hypervisor", Image: "ubuntu-24.04", At: time.Unix(1700000000, 0)}}
	}
	plan, err := p.DeployPlan(context.Background(), srv("r1-n01"))
	if err != nil || plan.Pieces != nil || plan.Wave != nil {
		t.Fatalf("plan without a piece listener: pieces %v wave %v err %v; want neither", plan.Pieces != nil, plan.Wave, err)
	}
	ctx1 := api.WithPeerAddr(context.Background(), "10.0.0.1:7480")
	if plan, err = p.DeployPlan(ctx1, srv("r1-n01")); err != nil || plan.Pieces != nil {
		t.Fatalf("plan before the manifest is made: pieces %v err %v; want none", plan.Pieces != nil, err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		if _, ok := store.CachedManifest("ubuntu-24.04"); ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the background manifest was not made within a minute")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if plan, err = p.DeployPlan(ctx1, srv("r1-n01")); err != nil || plan.Pieces == nil || plan.Wave == nil {
		t.Fatalf("plan with the manifest: %+v, %v", plan, err)
	}
	first := sha256.Sum256(blob[:images.PieceBytes])
	if plan.Pieces.SHA256 != raw.Hex || len(plan.Pieces.Pieces) != 2 || plan.Pieces.Pieces[0] != hex.EncodeToString(first[:]) || len(plan.Wave.Peers) != 0 {
		t.Errorf("first member's plan: pieces %+v, wave %+v", plan.Pieces, plan.Wave)
	}
	plan2, err := p.DeployPlan(api.WithPeerAddr(context.Background(), "10.0.0.2:7480"), srv("r1-n02"))
	if err != nil || plan2.Wave == nil || plan2.Wave.Token != plan.Wave.Token || len(plan2.Wave.Peers) != 1 || plan2.Wave.Peers[0] != "http://10.0.0.1:7480" {
		t.Errorf("second member's wave = %+v, %v; want the first's token and it as peer", plan2.Wave, err)
	}
}

// TestWaveCrossesZonesOnlyWhenTheProfileSays: two machines of one profile
// in different zones get no peer across by default; with the profile's
// shareAcrossZones they are one wave, the second naming the first.
func TestWaveCrossesZonesOnlyWhenTheProfileSays(t *testing.T) {
	for _, share := range []bool{false, true} {
		p, inv := pieceFixture(t)
		inv.Profile("hypervisor").ShareAcrossZones = share
		plan := func(name, zone, addr string) v1.Plan {
			srv := state.Server{Name: name, Zone: zone, Lifecycle: state.LifecycleDeploying,
				Allocation: &state.Allocation{Profile: "hypervisor", Image: "ubuntu-24.04", At: time.Unix(1700000000, 0)}}
			pl, err := p.DeployPlan(api.WithPeerAddr(context.Background(), addr), srv)
			if err != nil || pl.Wave == nil {
				t.Fatalf("plan of %s: wave %v, %v", name, pl.Wave, err)
			}
			return pl
		}
		a := plan("r1-n01", "zone-a", "10.0.1.1:7480")
		b := plan("r2-n01", "zone-b", "10.0.2.1:7480")
		crossed := len(b.Wave.Peers) == 1 && b.Wave.Peers[0] == "http://10.0.1.1:7480" && a.Wave.Token == b.Wave.Token
		if crossed != share {
			t.Errorf("shareAcrossZones %v: zone-b machine's wave %+v (zone-a's token equal: %v), want crossing %v", share, b.Wave, a.Wave.Token == b.Wave.Token, share)
		}
	}
}

// pieceFixture is a planner over the example inventory with a verified
// 4 MiB+100 B ubuntu-24.04 image whose manifest is cached.
func pieceFixture(t *testing.T) (*Planner, *inventory.Inventory) {
	t.Helper()
	res, err := inventory.Load(os.DirFS("../../inventory-example"), inventory.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	store, err := images.OpenStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	blob := make([]byte, images.PieceBytes+100)
	rand.Read(blob)
	sum := sha256.Sum256(blob)
	raw := images.Digest{Algo: "sha256", Hex: hex.EncodeToString(sum[:])}
	bp, _ := store.BlobPath(raw)
	if err := os.WriteFile(bp, blob, 0o444); err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(images.Record{Name: "ubuntu-24.04", Source: "http://mirror.invalid/u.img", State: images.StateVerified, SizeBytes: int64(len(blob)), Raw: raw})
	if err := os.WriteFile(filepath.Join(dir, "images", "ubuntu-24.04.json"), b, 0o640); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Manifest("ubuntu-24.04"); err != nil {
		t.Fatal(err)
	}
	inv := res.Inventory
	return &Planner{Desired: func() *inventory.Inventory { return inv }, Images: store, BaseURL: "http://10.99.0.1:8080", Join: fixedJoin{}, Waves: NewWaves()}, inv
}
