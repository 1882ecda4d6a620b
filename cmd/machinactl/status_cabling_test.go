package main

import (
	"bytes"
	"reflect"
	"strings"
	"testing"

	"github.com/machina-metal/machina/gitops"
	"github.com/machina-metal/machina/reconciler/plan"
	"github.com/machina-metal/machina/state"
)

// TestStatusShowsCabling: machinactl status lists each NIC's switch and
// port from commissioning's LLDP, counts the NICs that heard nothing, and
// makes a hostile system name (escape sequences off the wire) safe.
func TestStatusShowsCabling(t *testing.T) {
	snap := state.Snapshot{Servers: map[string]*state.Server{
		"r1-n01": {Name: "r1-n01", Lifecycle: state.LifecycleReady, Hardware: &state.Hardware{NICs: []state.NIC{
			{Name: "eno2", LLDP: &state.LLDP{ChassisID: "0c:29:ef:00:00:01", PortID: "0c:29:ef:00:00:08", PortIDSubtype: "mac", PortDescription: "Ethernet1/8"}},
			{Name: "eno1", LLDP: &state.LLDP{ChassisID: "0c:29:ef:00:00:01", SystemName: "leaf-r1-a", PortID: "Ethernet1/7", PortIDSubtype: "ifname", PortVLAN: 100}},
			{Name: "eno3"},
		}}},
		"r1-n02": {Name: "r1-n02", Lifecycle: state.LifecycleReady, Hardware: &state.Hardware{NICs: []state.NIC{
			{Name: "eno1", LLDP: &state.LLDP{ChassisID: "x", SystemName: "evil\x1b]0;pwned\x07", PortID: "p1"}},
		}}},
	}}
	var b bytes.Buffer
	writeStatus(&b, "http://c", map[string]int{"ready": 2}, true, 0, 0, gitops.InventoryStatus{}, plan.Result{}, snap)
	out := b.String()
	for _, want := range []string{
		"Cabling:    3 NICs heard their switch (LLDP at commissioning), 1 heard nothing",
		"  r1-n01           eno1     leaf-r1-a port Ethernet1/7 (port VLAN 100)\n  r1-n01           eno2     0c:29:ef:00:00:01 port Ethernet1/8\n",
		"r1-n02           eno1     evil",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q:\n%s", want, out)
		}
	}
	if strings.ContainsAny(out, "\x1b\x07") {
		t.Errorf("status carries raw escape bytes from an LLDP system name:\n%q", out)
	}
}

// TestStatusFileCarriesLLDP: the lldp block gitops writes under a status
// file's NIC is read back strictly into state.NIC.LLDP, so an offline plan
// (machinactl plan over status/) sees the cabling the controller saw.
func TestStatusFileCarriesLLDP(t *testing.T) {
	data := []byte(`name: r1-n01
lifecycle: ready
power: powered_off
hardware:
  cores: 64
  memoryGiB: 512
  nics:
  - name: eno1
    mac: "52:54:00:01:00:01"
    speedMbps: 25000
    switch: leaf-r1-a
    port: Ethernet1/7
    lldp:
      chassisID: "0c:29:ef:00:00:01"
      systemName: leaf-r1-a
      portID: "0c:29:ef:00:00:07"
      portIDSubtype: mac
      portDescription: Ethernet1/7
      portVLAN: 100
      vlans:
      - 100
      - 200
      maxFrameSize: 9216
  - name: eno2
    mac: "52:54:00:01:00:11"
`)
	s, err := parseStatusServer(data, fixedNow)
	if err != nil {
		t.Fatal(err)
	}
	want := &state.LLDP{ChassisID: "0c:29:ef:00:00:01", SystemName: "leaf-r1-a", PortID: "0c:29:ef:00:00:07", PortIDSubtype: "mac",
		PortDescription: "Ethernet1/7", PortVLAN: 100, VLANs: []int{100, 200}, MaxFrameSize: 9216}
	if s.Hardware == nil || len(s.Hardware.NICs) != 2 || !reflect.DeepEqual(s.Hardware.NICs[0].LLDP, want) || s.Hardware.NICs[1].LLDP != nil {
		t.Fatalf("parsed NICs = %+v", s.Hardware)
	}
}
