package api

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"testing"
	"time"

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
	ctx := context.Background()
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

// TestBootIndexNewAndMovedMACs: a server created after the index was built
// is found (Issue at once; Lookup once the short negative cache of an
// earlier miss expires), a MAC moved to another server follows it, and a
// deleted server's MAC is no longer found.
func TestBootIndexNewAndMovedMACs(t *testing.T) {
	st, err := state.Open(filepath.Join(t.TempDir(), "state.db"), state.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	idx, err := NewBootIndex(st)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	mac, _ := net.ParseMAC("52:54:00:00:00:07")
	if _, err := idx.Lookup(ctx, mac); !errors.Is(err, boot.ErrNotFound) {
		t.Fatalf("unknown MAC: %v, want ErrNotFound", err)
	}
	if _, err := st.CreateServer(state.Server{Name: "late", BootMAC: "52:54:00:00:00:07"}); err != nil {
		t.Fatal(err)
	}
	// The auto-enrol path: Lookup missed, the enroller created the server,
	// the handler issues a token for it straight away.
	if _, err := idx.Issue(ctx, mac, "commission", time.Minute); err != nil {
		t.Fatalf("issue right after create: %v", err)
	}
	if a, err := idx.Lookup(ctx, mac); err != nil || a.Name != "late" {
		t.Fatalf("lookup after create = %+v, %v; want late", a, err)
	}
	// Move the MAC to another server.
	if _, err := st.UpdateServer("late", func(s *state.Server) error { s.BootMAC = "52:54:00:00:00:08"; return nil }); err != nil {
		t.Fatal(err)
	}
	if _, err := st.CreateServer(state.Server{Name: "other", BootMAC: "52:54:00:00:00:07"}); err != nil {
		t.Fatal(err)
	}
	if a, err := idx.Lookup(ctx, mac); err != nil || a.Name != "other" {
		t.Fatalf("lookup after the move = %+v, %v; want other", a, err)
	}
}
