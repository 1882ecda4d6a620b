package fleet

import (
	"context"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/machina-metal/machina/bmc"
	"github.com/machina-metal/machina/state"
)

// sbOnly is a driver whose BMC has only a SecureBoot resource among the
// firmware areas.
type sbOnly struct{ bmc.Driver }

func (sbOnly) SecureBoot(context.Context) (*bmc.SecureBoot, error) {
	return &bmc.SecureBoot{Enable: true}, nil
}
func (sbOnly) SetSecureBoot(context.Context, bool) (*bmc.ApplyResult, error) { return nil, nil }

// TestSweepReadsFirmware: the sweep reads a server's firmware when it was
// never read, or when it is ready and the read predates its last
// lifecycle move (commissioned or released since), and not otherwise; the
// stored read keeps the volumes Machina created.
func TestSweepReadsFirmware(t *testing.T) {
	t0 := time.Date(2026, 12, 6, 3, 0, 0, 0, time.UTC)
	for _, tt := range []struct {
		name string
		srv  state.Server
		want bool
	}{
		{"never read", state.Server{Lifecycle: state.LifecycleDeployed}, true},
		{"ready, read before commissioning ended", state.Server{Lifecycle: state.LifecycleReady, LifecycleAt: t0, Firmware: &state.Firmware{ReadAt: t0.Add(-time.Minute)}}, true},
		{"ready, read since", state.Server{Lifecycle: state.LifecycleReady, LifecycleAt: t0, Firmware: &state.Firmware{ReadAt: t0.Add(time.Minute)}}, false},
		{"deployed, read long ago", state.Server{Lifecycle: state.LifecycleDeployed, LifecycleAt: t0, Firmware: &state.Firmware{ReadAt: t0.Add(-time.Hour)}}, false},
		{"retired", state.Server{Lifecycle: state.LifecycleRetired}, false},
	} {
		if got := needsFirmwareRead(tt.srv); got != tt.want {
			t.Errorf("%s: needsFirmwareRead = %v, want %v", tt.name, got, tt.want)
		}
	}

	st, err := state.Open(filepath.Join(t.TempDir(), "state.db"), state.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if _, err := st.CreateServer(state.Server{Name: "n1", Zone: "z", BootMAC: "52:54:00:22:00:01",
		BMC: state.BMCFacts{Driver: "redfish", Address: "https://10.0.0.1", Credentials: "c"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.UpdateServer("n1", func(s *state.Server) error {
		s.Firmware = &state.Firmware{ReadAt: time.Unix(0, 0).UTC(), CreatedVolumes: []string{"RAID.Integrated.1-1/Disk.Virtual.0"}}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(t.Output(), nil))
	w := NewSweep(st, nil, time.Hour, log)
	if !w.readFirmware(t.Context(), "n1", sbOnly{}, log) {
		t.Fatal("readFirmware stored nothing")
	}
	s, _ := st.Server("n1")
	fw := s.Firmware
	if fw == nil || fw.SecureBoot == nil || !fw.SecureBoot.Enable || len(fw.Unsupported) != 3 || fw.ReadAt.Before(t0) {
		t.Fatalf("stored firmware %+v; want Secure Boot read, three areas unsupported, a fresh ReadAt", fw)
	}
	if len(fw.CreatedVolumes) != 1 || fw.CreatedVolumes[0] != "RAID.Integrated.1-1/Disk.Virtual.0" {
		t.Errorf("CreatedVolumes = %v; want the volume Machina created kept", fw.CreatedVolumes)
	}
}
