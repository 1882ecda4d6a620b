package gitops

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

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
