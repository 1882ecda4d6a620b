package api

import (
	"encoding/json"
	"os"
	"reflect"
	"strings"
	"testing"

	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/schema"
	"github.com/machina-metal/machina/state"
)

func schemaTestReport() v1.AgentReport {
	return v1.AgentReport{BootMAC: "52:54:00:00:00:07", AgentVersion: "dev",
		Facts: v1.Facts{CPU: v1.CPU{Model: "Xeon", Vendor: "GenuineIntel", Arch: "amd64", Sockets: 1, Cores: 8, Threads: 16, Online: 16, Flags: []string{"vmx"}},
			Memory: v1.Memory{TotalBytes: 32 << 30, DIMMs: []v1.DIMM{{Locator: "A1", SizeBytes: 32 << 30}}},
			Disks:  []v1.Disk{{Name: "sda", SizeBytes: 200 << 30, Model: "disk", ByPath: "pci-0000:00:1f.2-ata-1"}},
			NICs:   []v1.NIC{{Name: "eth0", MAC: "52:54:00:00:00:07", Link: true, SpeedMbps: 10000}},
			DMI:    v1.DMI{SystemVendor: "Dell Inc.", SystemProduct: "PowerEdge R650"}},
		Tests: []v1.TestResult{{Name: v1.TestCPU, Passed: true, Duration: 1e9, Metrics: map[string]float64{"mips": 1000}}, {Name: v1.TestMemory, Passed: true},
			{Name: v1.TestDisk, Passed: true}, {Name: v1.TestNetwork, Passed: true}}}
}

func schemaTestLLDP() *v1.LLDP {
	return &v1.LLDP{ChassisID: "0c:29:ef:00:00:01", ChassisIDSubtype: "mac", SystemName: "leaf-r1-a", PortID: "Ethernet1/7", PortIDSubtype: "local",
		PortDescription: "r1-n07 eth0", PortVLAN: 100, VLANs: []v1.LLDPVLAN{{ID: 100, Name: "prov"}, {ID: 200}}, MaxFrameSize: 9216}
}

// TestReportSchemaAndChecksAgree: the commissioning report schema
// (schema/agent-report.schema.json, in the repository and embedded in
// package schema) and the handler's Go checks refuse the same malformed
// reports (a test missing, twice, unknown or a fifth; no disk under a
// passed disk test, only a virtual one; numbers out of bounds; a bad boot
// MAC) and accept the good one and a failed disk test without a disk (the
// agent's disk test fails when no disk is found, and that report is
// well formed). Text fields beyond their bounds only the schema refuses.
func TestReportSchemaAndChecksAgree(t *testing.T) {
	if _, err := os.Stat("../schema/" + schema.AgentReport.FileName()); err != nil {
		t.Fatalf("the report schema is not in the repository: %v", err)
	}
	mod := func(f func(*v1.AgentReport)) v1.AgentReport {
		r := schemaTestReport()
		f(&r)
		return r
	}
	cases := []struct {
		name       string
		rep        v1.AgentReport
		ok, goSays bool // goSays: checkReport refuses it too
	}{
		{"good", schemaTestReport(), true, true},
		{"firmware arch (cpu.smbiosArch)", mod(func(r *v1.AgentReport) { r.Facts.CPU.Arch, r.Facts.CPU.SMBIOSArch = "386", "amd64" }), true, true},
		{"firmware arch not a GOARCH name", mod(func(r *v1.AgentReport) { r.Facts.CPU.SMBIOSArch = "x86_64" }), false, false},
		{"disk test failed, no disk", mod(func(r *v1.AgentReport) {
			r.Facts.Disks = nil
			r.Tests[2] = v1.TestResult{Name: v1.TestDisk, Passed: false, Reason: "no disk found"}
		}), true, true},
		{"disk test passed, no disk", mod(func(r *v1.AgentReport) { r.Facts.Disks = nil }), false, true},
		{"disk test passed, only a virtual disk", mod(func(r *v1.AgentReport) { r.Facts.Disks[0].Virtual = true }), false, true},
		{"test missing", mod(func(r *v1.AgentReport) { r.Tests = r.Tests[:3] }), false, true},
		{"test twice", mod(func(r *v1.AgentReport) { r.Tests[3] = r.Tests[0] }), false, true},
		{"fifth test", mod(func(r *v1.AgentReport) { r.Tests = append(r.Tests, v1.TestResult{Name: "gpu", Passed: true}) }), false, true},
		{"no tests", mod(func(r *v1.AgentReport) { r.Tests = nil }), false, true},
		{"zero cores", mod(func(r *v1.AgentReport) { r.Facts.CPU.Cores = 0 }), false, true},
		{"100000 cores", mod(func(r *v1.AgentReport) { r.Facts.CPU.Cores = 100000 }), false, true},
		{"no memory", mod(func(r *v1.AgentReport) { r.Facts.Memory.TotalBytes = 0 }), false, true},
		{"2 PiB disk", mod(func(r *v1.AgentReport) { r.Facts.Disks[0].SizeBytes = 2 << 50 }), false, true},
		{"bad boot MAC", mod(func(r *v1.AgentReport) { r.BootMAC = "not-a-mac" }), false, true},
		{"10,000-character reason", mod(func(r *v1.AgentReport) {
			r.Tests[2] = v1.TestResult{Name: v1.TestDisk, Passed: false, Reason: strings.Repeat("x", 10000)}
		}), false, false},
		{"nic with LLDP", mod(func(r *v1.AgentReport) { r.Facts.NICs[0].LLDP = schemaTestLLDP() }), true, true},
		{"LLDP VLAN 5000", mod(func(r *v1.AgentReport) { l := schemaTestLLDP(); l.VLANs[0].ID = 5000; r.Facts.NICs[0].LLDP = l }), false, true},
		{"LLDP port VLAN -1", mod(func(r *v1.AgentReport) { l := schemaTestLLDP(); l.PortVLAN = -1; r.Facts.NICs[0].LLDP = l }), false, true},
		{"LLDP 300-byte system name", mod(func(r *v1.AgentReport) {
			l := schemaTestLLDP()
			l.SystemName = strings.Repeat("s", 300)
			r.Facts.NICs[0].LLDP = l
		}), false, true},
		{"LLDP unknown port ID subtype", mod(func(r *v1.AgentReport) { l := schemaTestLLDP(); l.PortIDSubtype = "shell"; r.Facts.NICs[0].LLDP = l }), false, false},
		{"1,000-character system vendor", mod(func(r *v1.AgentReport) { r.Facts.DMI.SystemVendor = strings.Repeat("v", 1000) }), false, false},
	}
	for _, c := range cases {
		body, err := json.Marshal(c.rep)
		if err != nil {
			t.Fatal(err)
		}
		serr := checkReportSchema(body)
		gerr := checkReport(c.rep)
		if (serr == nil) != c.ok {
			t.Errorf("%s: schema says %v, want ok=%v", c.name, serr, c.ok)
		}
		if (gerr == nil) != (c.ok || !c.goSays) {
			t.Errorf("%s: checkReport says %v, want ok=%v", c.name, gerr, c.ok || !c.goSays)
		}
		if serr != nil && !strings.Contains(serr.Error(), "agent-report.schema.json") {
			t.Errorf("%s: %v does not name the schema", c.name, serr)
		}
	}
}

// TestServerAPIShowsLLDP: the admin API's server (toServer) carries each
// NIC's stored LLDP finding, VLANs by ID.
func TestServerAPIShowsLLDP(t *testing.T) {
	l := schemaTestLLDP()
	s := toServer(state.Server{Name: "r1-n07", Hardware: &state.Hardware{NICs: []state.NIC{{Name: "eth0", LLDP: lldpToState(l)}, {Name: "eth1"}}}})
	got := s.Hardware.NICs[0].LLDP
	l.ChassisIDSubtype, l.VLANs = "", []v1.LLDPVLAN{{ID: 100}, {ID: 200}}
	if got == nil || !reflect.DeepEqual(*got, *l) || s.Hardware.NICs[1].LLDP != nil {
		t.Errorf("toServer NICs = %+v, %+v; want eth0 %+v", got, s.Hardware.NICs[1].LLDP, l)
	}
}
