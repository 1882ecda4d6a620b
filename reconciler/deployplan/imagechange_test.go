package deployplan

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/machina-metal/machina/images"
	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/state"
)

// TestImageChangeBeforeWrite: a profile whose image changes after the
// allocation (here while the server is deploying, before the ramdisk got
// its plan) deploys the new image, and the image token the API mints for
// that plan is accepted for it; once the plan was served the image is
// fixed for this deploy (a later change waits for a redeploy), and a
// refused image request says why. Before this fix the plan named the new
// image while the token stayed bound to the allocation's old one: the
// deploy failed with "get image: HTTP 403".
func TestImageChangeBeforeWrite(t *testing.T) {
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
	for _, name := range []string{"ubuntu-24.04", "ubuntu-24.04-new", "ubuntu-24.04-newer"} {
		rec := images.Record{Name: name, Source: "http://mirror.invalid/" + name, State: images.StateVerified, SizeBytes: 3 << 30,
			Raw: images.Digest{Algo: "sha256", Hex: strings.Repeat("ab", 32)}}
		b, _ := json.Marshal(rec)
		if err := os.WriteFile(filepath.Join(dir, "images", name+".json"), b, 0o640); err != nil {
			t.Fatal(err)
		}
	}
	st, err := state.Open(filepath.Join(t.TempDir(), "state.db"), state.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	const name = "r1-n01"
	if _, err := st.CreateServer(state.Server{Name: name, Zone: "zone-a", BootMAC: "52:54:00:01:00:01"}); err != nil {
		t.Fatal(err)
	}
	for _, m := range []state.Move{{Server: name, From: state.LifecycleNew, To: state.LifecycleCommissioning},
		{Server: name, From: state.LifecycleCommissioning, To: state.LifecycleReady},
		{Server: name, From: state.LifecycleReady, To: state.LifecycleAllocated, Update: func(s *state.Server) error {
			s.Allocation = &state.Allocation{Profile: "hypervisor", Image: "ubuntu-24.04", Deploy: "image", At: time.Unix(1700000000, 0)}
			return nil
		}},
		{Server: name, From: state.LifecycleAllocated, To: state.LifecycleDeploying}} {
		if _, err := st.Apply(m); err != nil {
			t.Fatal(err)
		}
	}
	inv.Profile("hypervisor").Image = "ubuntu-24.04-new"
	p := &Planner{Desired: func() *inventory.Inventory { return inv }, Images: store, BaseURL: "http://10.99.0.1:8080", Join: fixedJoin{}, Store: st}
	srv, _ := st.Server(name)
	plan, err := p.DeployPlan(context.Background(), srv)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(plan.ImageURL, "/images/ubuntu-24.04-new") {
		t.Errorf("plan image %s, want the profile's new image ubuntu-24.04-new", plan.ImageURL)
	}
	srv, _ = st.Server(name)
	if srv.Allocation.Image != "ubuntu-24.04-new" || srv.Allocation.PlanServedAt.IsZero() {
		t.Errorf("allocation %+v, want image ubuntu-24.04-new and the plan's time", srv.Allocation)
	}
	// The image token the API mints with the plan (api/machine.go) is
	// accepted for the planned image, refused for the old one with a reason.
	tok, _, err := st.IssueToken(state.TokenSpec{Purpose: state.PurposeImage, Server: name, MAC: srv.BootMAC, TTL: time.Hour, Reusable: true})
	if err != nil {
		t.Fatal(err)
	}
	checker := NewImageTokens(st)
	if err := checker.CheckImageToken(context.Background(), tok, "ubuntu-24.04-new"); err != nil {
		t.Errorf("image token for the planned image: %v", err)
	}
	err = checker.CheckImageToken(context.Background(), tok, "ubuntu-24.04")
	if !errors.Is(err, images.ErrTokenRejected) || !strings.Contains(err.Error(), "names image ubuntu-24.04-new, not ubuntu-24.04") {
		t.Errorf("image token for the old image: %v, want a rejection naming both images", err)
	}
	// After the write started: a newer profile image does not change this
	// deploy (a retried plan request names the same image).
	inv.Profile("hypervisor").Image = "ubuntu-24.04-newer"
	if plan, err = p.DeployPlan(context.Background(), srv); err != nil || !strings.HasSuffix(plan.ImageURL, "/images/ubuntu-24.04-new") {
		t.Errorf("plan after the write started: %s, %v; want ubuntu-24.04-new still", plan.ImageURL, err)
	}
	if ev, _ := st.Events(state.EventQuery{Server: name}); !hasEvent(ev, "deploy.image_replanned") {
		t.Errorf("no deploy.image_replanned event in %+v", ev)
	}
}

func hasEvent(evs []state.Event, kind string) bool {
	for _, e := range evs {
		if string(e.Kind) == kind {
			return true
		}
	}
	return false
}
