package api_test

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/state"
)

// TestReportKeepsLLDP: each NIC's LLDP finding of a commissioning report
// is stored with the server's hardware (VLAN names dropped); a NIC that
// heard nothing stays without one.
func TestReportKeepsLLDP(t *testing.T) {
	f := machineFixture(t, nil)
	walk(t, f, state.LifecycleCommissioning)
	tok := issueFor(t, f, state.PurposeReport)
	rep := goodReport()
	rep.Facts.NICs = []v1.NIC{
		{Name: "eth0", MAC: onceMAC, LLDP: &v1.LLDP{ChassisID: "0c:29:ef:00:00:01", ChassisIDSubtype: "mac", SystemName: "leaf-r1-a",
			PortID: "Ethernet1/7", PortIDSubtype: "local", PortDescription: "r1-n07 eth0", PortVLAN: 100,
			VLANs: []v1.LLDPVLAN{{ID: 100, Name: "prov"}, {ID: 200, Name: "storage"}}, MaxFrameSize: 9216}},
		{Name: "eth1", MAC: "52:54:00:00:00:99"},
	}
	if code, _, b := f.do(t, http.MethodPost, v1.PathAgentReport, tok, mustJSON(t, rep)); code != http.StatusOK {
		t.Fatalf("report: %d %s", code, b)
	}
	s, err := f.store.Server("r1-n07")
	if err != nil || s.Hardware == nil || len(s.Hardware.NICs) != 2 {
		t.Fatalf("stored: %+v, %v", s.Hardware, err)
	}
	want := &state.LLDP{ChassisID: "0c:29:ef:00:00:01", SystemName: "leaf-r1-a", PortID: "Ethernet1/7", PortIDSubtype: "local",
		PortDescription: "r1-n07 eth0", PortVLAN: 100, VLANs: []int{100, 200}, MaxFrameSize: 9216}
	if d := cmp.Diff(want, s.Hardware.NICs[0].LLDP); d != "" {
		t.Errorf("stored eth0 LLDP (-want +got):\n%s", d)
	}
	if s.Hardware.NICs[1].LLDP != nil {
		t.Errorf("eth1 heard nothing but stored %+v", s.Hardware.NICs[1].LLDP)
	}
	// Round trip through JSON, as the store's engines and the API keep it.
	b, _ := json.Marshal(s.Hardware.NICs[0])
	var back state.NIC
	if err := json.Unmarshal(b, &back); err != nil || !cmp.Equal(back.LLDP, want) {
		t.Errorf("JSON round trip: %s -> %+v, %v", b, back.LLDP, err)
	}
}
