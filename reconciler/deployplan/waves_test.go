package deployplan

import (
	"strings"
	"testing"
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
