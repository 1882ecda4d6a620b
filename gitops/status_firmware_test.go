package gitops

import (
	"bytes"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/machina-metal/machina/reconciler/plan"
	"github.com/machina-metal/machina/state"
)

// TestRenderFirmwareBlock: a server's firmware read becomes a small
// firmware block in its status file (registry, counts, Secure Boot,
// volumes with their level, the ones Machina created, unsupported areas),
// parseable YAML; a server never read has none.
func TestRenderFirmwareBlock(t *testing.T) {
	at := time.Date(2026, 12, 6, 3, 0, 0, 0, time.UTC)
	fw := statusFirmware(&state.Firmware{ReadAt: at,
		BIOS:        &state.FirmwareBIOS{RegistryID: "BiosAttributeRegistry.v1_0_3", Attributes: state.NewBIOSValues(map[string]any{"A": "x", "B": "y"}), Pending: map[string]any{"A": "z"}},
		Storage:     []state.StorageController{{ID: "M.2", Volumes: []state.Volume{{ID: "v0", Name: "os", RAIDType: "RAID1"}}}},
		Components:  []state.FirmwareComponent{{ID: "UEFI"}, {ID: "BMC"}},
		SecureBoot:  &state.SecureBootState{Enable: true},
		Unsupported: map[string]string{"raid": "no Storage"}, CreatedVolumes: []string{"M.2/os"},
	})
	out := renderServer(ServerStatus{Name: "r1-n03", Lifecycle: "deployed", Firmware: fw}, 0)
	var v map[string]any
	if err := yamlUnmarshal(out, &v); err != nil {
		t.Fatalf("does not parse: %v\n%s", err, out)
	}
	want := map[string]any{"readAt": "2026-12-06T03:00:00Z", "biosRegistry": "BiosAttributeRegistry.v1_0_3", "biosAttributes": 2, "biosPending": 1,
		"secureBoot": "enabled", "volumes": []any{"M.2/os RAID1"}, "createdVolumes": []any{"M.2/os"}, "components": 2, "unsupported": []any{"raid"}}
	if d := cmp.Diff(want, v["firmware"]); d != "" {
		t.Errorf("firmware block (-want +got):\n%s\n%s", d, out)
	}
	if out := renderServer(ServerStatus{Name: "r1-n04", Lifecycle: "ready"}, 0); yamlHasKey(t, out, "firmware") {
		t.Errorf("a server never read has a firmware block:\n%s", out)
	}
}

func yamlHasKey(t *testing.T, b []byte, key string) bool {
	t.Helper()
	var v map[string]any
	if err := yamlUnmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	_, ok := v[key]
	return ok
}

// modelReading is server i's firmware reading among servers of model m
// (0 or 1): 300 BIOS attributes equal across the model but for the
// service tag, a few pending, 12 components.
func modelReading(m, i int) *state.Firmware {
	vals := map[string]any{"SystemServiceTag": fmt.Sprintf("TAG%03d", i)}
	for a := range 299 {
		vals[fmt.Sprintf("M%dAttr%03d", m, a)] = []any{"Enabled", int64(a), false}[a%3]
	}
	fw := &state.Firmware{ReadAt: time.Date(2026, 12, 7, 0, 0, i, 0, time.UTC),
		BIOS: &state.FirmwareBIOS{RegistryID: fmt.Sprintf("Registry%d", m), Attributes: state.NewBIOSValues(vals), Pending: map[string]any{"BootMode": "Uefi"}}}
	for c := range 12 {
		fw.Components = append(fw.Components, state.FirmwareComponent{ID: fmt.Sprintf("C%d", c), Version: fmt.Sprintf("%d.0", m)})
	}
	return fw
}

// TestStatusFirmwareSameWhenShared checks that the status files of
// servers whose stored readings share their BIOS values and firmware
// inventories (the store's decode cache) show each server's own reading:
// every firmware block renders as the block of the reading as it was
// read, from the records just written and from a store opened again
// (every record decoded).
func TestStatusFirmwareSameWhenShared(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	st, err := state.Open(path, state.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	const n = 12
	name := func(i int) string { return fmt.Sprintf("r1-n%02d", i) }
	for i := range n {
		if _, err := st.CreateServer(state.Server{Name: name(i), Lifecycle: state.LifecycleReady}); err != nil {
			t.Fatal(err)
		}
		if _, err := st.UpdateServer(name(i), func(s *state.Server) error { s.Firmware = modelReading(i%2, i); return nil }); err != nil {
			t.Fatal(err)
		}
	}
	check := func(when string, st *state.Store) {
		t.Helper()
		out, err := (&StatusBuilder{Store: st}).Build(InventoryStatus{}, nil, plan.Result{})
		if err != nil {
			t.Fatal(err)
		}
		if len(out.Servers) != n {
			t.Fatalf("%s: %d servers in status, want %d", when, len(out.Servers), n)
		}
		for i, ss := range out.Servers {
			want := renderServer(ServerStatus{Name: ss.Name, Firmware: statusFirmware(modelReading(i%2, i))}, 0)
			got := renderServer(ServerStatus{Name: ss.Name, Firmware: ss.Firmware}, 0)
			if !bytes.Equal(got, want) {
				t.Errorf("%s: %s's firmware block:\n%s\nwant:\n%s", when, ss.Name, got, want)
			}
		}
	}
	check("written", st)
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	st, err = state.Open(path, state.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	check("decoded", st)
}
