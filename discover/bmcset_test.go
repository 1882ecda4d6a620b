package discover

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/machina-metal/machina/inventory"
)

func TestSetBMC(t *testing.T) {
	ex := exampleFiles(t)
	before, err := inventory.Load(mapFS(ex), inventory.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	nb := inventory.BMC{Driver: inventory.DriverRedfish, Address: "https://10.10.9.11", Credentials: "bmc-new", SystemID: "1", InsecureTLS: true}
	for _, name := range []string{"r1-n01", "r1-n04", "r3-n03"} {
		out, err := SetBMC(ex[inventory.ServersFile], name, nb)
		if err != nil {
			t.Fatal(err)
		}
		files := map[string][]byte{}
		for k, v := range ex {
			files[k] = v
		}
		files[inventory.ServersFile] = out
		after, err := inventory.Load(mapFS(files), inventory.Limits{})
		if err != nil {
			t.Fatalf("%s: %v\n%s", name, err, Diff("servers.yaml", ex[inventory.ServersFile], out))
		}
		for i, s := range after.Inventory.Servers {
			want := before.Inventory.Servers[i]
			if s.Name == name {
				if s.BMC != nb {
					t.Errorf("%s: bmc %+v", name, s.BMC)
				}
				want.BMC = nb
			}
			if !reflect.DeepEqual(s, want) {
				t.Errorf("%s: server %s changed: %+v", name, s.Name, s)
			}
		}
		// Only the bmc block's lines changed.
		d := Diff("servers.yaml", ex[inventory.ServersFile], out)
		for _, l := range strings.Split(d, "\n") {
			if strings.HasPrefix(l, "-") && !strings.HasPrefix(l, "---") && !strings.Contains(l, "bmc") && !strings.Contains(l, "driver") && !strings.Contains(l, "address") && !strings.Contains(l, "credentials") && !strings.Contains(l, "systemID") && !strings.Contains(l, "insecureTLS") {
				t.Errorf("%s: removed a non-bmc line %q", name, l)
			}
		}
	}
	if _, err := SetBMC(ex[inventory.ServersFile], "nope", nb); !errors.Is(err, ErrNoServer) {
		t.Errorf("unknown server: %v", err)
	}
	// A server without a bmc block gets one.
	in := "servers:\n  - name: a\n    zone: z\n    bootMAC: \"52:54:00:00:00:01\"\n  - name: b\n"
	out, err := SetBMC([]byte(in), "a", nb)
	if err != nil || !strings.Contains(string(out), "bootMAC: \"52:54:00:00:00:01\"\n    bmc:\n      driver: \"redfish\"\n") || !strings.HasSuffix(string(out), "  - name: b\n") {
		t.Errorf("insert: %q %v", out, err)
	}
}
