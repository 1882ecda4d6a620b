package state_test

import (
	"errors"
	"testing"
	"time"

	"github.com/machina-metal/machina/state"
)

func TestAdoptServer(t *testing.T) {
	eachEngine(t, func(t *testing.T) {
		st := openTest(t, state.Options{})
		at := time.Date(2026, 11, 29, 21, 0, 0, 0, time.UTC)
		if _, err := st.CreateServer(state.Server{Name: "auto-525400aa0001", BootMAC: "52:54:00:aa:00:01", Zone: "discovered",
			Enrolled: &state.Enrolment{At: at, Source: "ipxe", Branch: "discovered/2026-11-29"}}); err != nil {
			t.Fatal(err)
		}
		if _, err := st.CreateServer(state.Server{Name: "r1-n01", BootMAC: "52:54:00:aa:00:02"}); err != nil {
			t.Fatal(err)
		}

		// Commissioning: a report token is bound to the old name.
		if _, err := st.Transition("auto-525400aa0001", state.LifecycleNew, state.LifecycleCommissioning, "enrol"); err != nil {
			t.Fatal(err)
		}
		if _, err := st.AdoptServer("auto-525400aa0001", "r9-n01", ""); !errors.Is(err, state.ErrInvalid) {
			t.Fatalf("AdoptServer while commissioning = %v, want ErrInvalid", err)
		}
		if _, err := st.Transition("auto-525400aa0001", state.LifecycleCommissioning, state.LifecycleReady, "report"); err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			from, to string
			want     error
		}{
			{"auto-525400aa0001", "r1-n01", state.ErrExists}, // taken
			{"auto-525400aa0001", "Bad_Name", state.ErrInvalid},
			{"nope", "r9-n03", state.ErrNotFound},
		} {
			if _, err := st.AdoptServer(tc.from, tc.to, ""); !errors.Is(err, tc.want) {
				t.Errorf("AdoptServer(%s, %s) = %v, want %v", tc.from, tc.to, err, tc.want)
			}
		}

		got, err := st.AdoptServer("auto-525400aa0001", "r9-n01", "op")
		if err != nil {
			t.Fatal(err)
		}
		if got.Name != "r9-n01" || got.Lifecycle != state.LifecycleReady || got.BootMAC != "52:54:00:aa:00:01" || got.Enrolled == nil || got.Enrolled.Branch != "discovered/2026-11-29" {
			t.Errorf("adopted = %+v", got)
		}
		if _, err := st.Server("auto-525400aa0001"); !errors.Is(err, state.ErrNotFound) {
			t.Errorf("old name still there: %v", err)
		}
		for _, name := range []string{"auto-525400aa0001", "r9-n01"} {
			evs, err := st.Events(state.EventQuery{Server: name})
			if err != nil {
				t.Fatal(err)
			}
			if last := evs[len(evs)-1]; last.Kind != state.EventAdopted || last.Actor != "op" {
				t.Errorf("%s last event = %+v, want %s by op", name, last, state.EventAdopted)
			}
		}
	})
}

// TestAdoptRenamedServer: a server renamed in servers.yaml (same boot MAC)
// keeps its record under the new name, and its hosts follow.
func TestAdoptRenamedServer(t *testing.T) {
	eachEngine(t, func(t *testing.T) {
		st := openTest(t, state.Options{})
		if _, err := st.CreateServer(state.Server{Name: "r1-n05", BootMAC: "52:54:00:01:00:05"}); err != nil {
			t.Fatal(err)
		}
		if _, err := st.PutHost(state.Host{Name: "h-r1-n05", Server: "r1-n05"}); err != nil {
			t.Fatal(err)
		}
		if _, err := st.PutHost(state.Host{Name: "other", Server: "r1-n06"}); err != nil {
			t.Fatal(err)
		}
		got, err := st.AdoptServer("r1-n05", "r1-n55", "")
		if err != nil {
			t.Fatal(err)
		}
		if got.Name != "r1-n55" || got.BootMAC != "52:54:00:01:00:05" {
			t.Errorf("adopted = %+v", got)
		}
		if h, _ := st.Host("h-r1-n05"); h.Server != "r1-n55" {
			t.Errorf("host h-r1-n05 runs on %q, want r1-n55", h.Server)
		}
		if h, _ := st.Host("other"); h.Server != "r1-n06" {
			t.Errorf("an unrelated host moved to %q", h.Server)
		}
		evs, _ := st.Events(state.EventQuery{Server: "r1-n55"})
		if len(evs) == 0 || evs[len(evs)-1].Message != "server r1-n05 adopted as r1-n55 (servers.yaml entry with boot MAC 52:54:00:01:00:05)" {
			t.Errorf("events %+v", evs)
		}
	})
}
