package inventory

import (
	"strings"
	"testing"
	"testing/fstest"

	"github.com/google/go-cmp/cmp"
)

// TestServerNICs: servers.yaml nics name a NIC by mac (normalised) or by
// name with an expected switch and port; a NIC named twice, by both mac
// and name, with neither, or two NICs on one switch port are refused with
// file:line; a missing switch or an unknown field is a schema error.
func TestServerNICs(t *testing.T) {
	load := func(nics string) (*Result, error) {
		return Load(fstest.MapFS{ServersFile: {Data: []byte("servers:\n  - name: n1\n    zone: z\n    bootMAC: \"52:54:00:00:00:01\"\n" +
			"    bmc: {driver: ipmi, address: \"10.0.0.1\", credentials: c}\n    nics:\n" + nics)}}, Limits{})
	}
	res, err := load("      - mac: \"52-54-00-00-00-0A\"\n        expect: {switch: leaf-r1-a, port: Ethernet1/7}\n" +
		"      - name: eth1\n        expect: {switch: leaf-r1-b, port: Ethernet1/7}\n")
	if err != nil {
		t.Fatalf("Load = %v", err)
	}
	want := []ServerNIC{{MAC: "52:54:00:00:00:0a", Expect: CablingExpect{Switch: "leaf-r1-a", Port: "Ethernet1/7"}},
		{Name: "eth1", Expect: CablingExpect{Switch: "leaf-r1-b", Port: "Ethernet1/7"}}}
	if d := cmp.Diff(want, res.Inventory.Servers[0].NICs); d != "" {
		t.Errorf("nics (-want +got):\n%s", d)
	}
	for name, tc := range map[string]struct{ nics, want string }{
		"twice": {"      - mac: \"52:54:00:00:00:0a\"\n        expect: {switch: a, port: p1}\n      - mac: \"52:54:00:00:00:0A\"\n        expect: {switch: a, port: p2}\n",
			"servers.yaml:9:9: servers[0].nics[1]: NIC 52:54:00:00:00:0a is also nics[0]"},
		"both": {"      - mac: \"52:54:00:00:00:0a\"\n        name: eth0\n        expect: {switch: a, port: p1}\n",
			"servers.yaml:8:15: servers[0].nics[0].name: name a NIC by mac or by name, not both"},
		"one port": {"      - name: eth0\n        expect: {switch: Leaf, port: p1}\n      - name: eth1\n        expect: {switch: leaf, port: P1}\n",
			"servers[0].nics[1].expect: switch leaf port P1 is also expected for nics[0]: one cable per port"},
		"neither":   {"      - expect: {switch: a, port: p1}\n", "servers[0].nics[0]"},
		"no switch": {"      - name: eth0\n        expect: {port: p1}\n", "servers[0].nics[0].expect"},
		"bad field": {"      - name: eth0\n        expect: {switch: a, port: p1, vlan: 3}\n", "servers[0].nics[0].expect"},
		"bad name":  {"      - name: \"eth0; reboot\"\n        expect: {switch: a, port: p1}\n", "servers[0].nics[0].name"},
	} {
		_, err := load(tc.nics)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Load = %v, want an error containing %q", name, err, tc.want)
		}
	}
}
