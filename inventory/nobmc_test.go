package inventory

import (
	"encoding/json"
	"strings"
	"testing"
	"testing/fstest"
)

// TestServerWithoutBMC: the bmc block is optional (an auto-enrolled
// machine's proposed entry has none). Such a server loads with a warning
// naming `machinactl server bmc-set`, several of them do not clash on an
// empty BMC address, and the normalised form omits the zero BMC.
func TestServerWithoutBMC(t *testing.T) {
	fsys := fstest.MapFS{ServersFile: {Data: []byte(`servers:
  - name: auto-525400aa0001
    zone: discovered
    tags: ["auto-enrolled"]
    bootMAC: "52:54:00:aa:00:01"
    bootMode: uefi
  - name: auto-525400aa0002
    zone: discovered
    bootMAC: "52:54:00:aa:00:02"
  - name: n01
    zone: z
    bootMAC: "52:54:00:00:00:01"
    bmc: {driver: ipmi, address: "10.0.0.1", credentials: c}
`)}}
	res, err := Load(fsys, Limits{})
	if err != nil {
		t.Fatalf("Load = %v, want valid", err)
	}
	var warns []string
	for _, w := range res.Warnings {
		warns = append(warns, w.Error())
	}
	if len(warns) != 2 {
		t.Fatalf("warnings = %q, want one per server without a BMC", warns)
	}
	for i, w := range warns {
		want := []string{"servers.yaml:2:5", "servers.yaml:7:5"}[i]
		if !strings.HasPrefix(w, want) || !strings.Contains(w, "no BMC: Machina cannot power or boot-override this server") || !strings.Contains(w, "machinactl server bmc-set") {
			t.Errorf("warning %d = %q, want at %s naming bmc-set", i, w, want)
		}
	}
	inv := res.Inventory
	if !inv.Servers[0].BMC.IsZero() || inv.Servers[2].BMC.IsZero() {
		t.Errorf("IsZero: %v %v", inv.Servers[0].BMC.IsZero(), inv.Servers[2].BMC.IsZero())
	}
	b, err := json.Marshal(inv.Servers[0])
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), `"bmc"`) {
		t.Errorf("normalised server without BMC = %s, want no bmc key", b)
	}

	// An incomplete bmc block is still an error: only the whole block is optional.
	bad := fstest.MapFS{ServersFile: {Data: []byte("servers:\n  - name: a\n    zone: z\n    bootMAC: \"52:54:00:aa:00:01\"\n    bmc: {driver: redfish}\n")}}
	if _, err := Load(bad, Limits{}); err == nil || !strings.Contains(err.Error(), `missing required field "address"`) {
		t.Errorf("Load(bmc without address) = %v, want missing address", err)
	}
}
