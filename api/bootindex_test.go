package api

import (
	"context"
	"net"
	"path/filepath"
	"testing"

	"github.com/machina-metal/machina/boot"
	"github.com/machina-metal/machina/state"
)

// TestBootIndexFreshAfterWrite: a lookup right after a lifecycle change
// sees it, with no time for any background goroutine to run (the lab's
// machines reboot the instant their deploy is recorded).
func TestBootIndexFreshAfterWrite(t *testing.T) {
	st, err := state.Open(filepath.Join(t.TempDir(), "state.db"), state.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if _, err := st.CreateServer(state.Server{Name: "s1", BootMAC: "52:54:00:00:00:01"}); err != nil {
		t.Fatal(err)
	}
	idx, err := NewBootIndex(st)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go idx.Run(ctx)
	mac, _ := net.ParseMAC("52:54:00:00:00:01")
	for _, to := range []state.Lifecycle{state.LifecycleCommissioning, state.LifecycleReady, state.LifecycleCommissioning, state.LifecycleFailed} {
		for i := 0; i < 50; i++ {
			a, err := idx.Lookup(ctx, mac)
			if err != nil {
				t.Fatal(err)
			}
			srv, _ := st.Server("s1")
			if a.Lifecycle != boot.Lifecycle(srv.Lifecycle) {
				t.Fatalf("lookup says %s, store says %s", a.Lifecycle, srv.Lifecycle)
			}
		}
		srv, _ := st.Server("s1")
		if _, err := st.Transition("s1", srv.Lifecycle, to, "test"); err != nil {
			t.Fatal(err)
		}
		a, err := idx.Lookup(ctx, mac)
		if err != nil {
			t.Fatal(err)
		}
		if a.Lifecycle != boot.Lifecycle(to) {
			t.Fatalf("lookup right after the move to %s says %s", to, a.Lifecycle)
		}
	}
}
