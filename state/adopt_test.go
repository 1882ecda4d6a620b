package state_test

import (
	"errors"
	"testing"
	"time"

	"github.com/machina-metal/machina/state"
)

func TestAdoptServer(t *testing.T) {
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
		{"r1-n01", "r9-n02", state.ErrInvalid},           // not auto-enrolled
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
}
