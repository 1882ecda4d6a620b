package redfish_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/machina-metal/machina/bmc"
	"github.com/machina-metal/machina/bmc/bmcsim"
	"github.com/machina-metal/machina/bmc/redfish"
)

func tempNamed(ts []bmc.Temperature, name string) (bmc.Temperature, bool) {
	i := slices.IndexFunc(ts, func(t bmc.Temperature) bool { return t.Name == name })
	if i < 0 {
		return bmc.Temperature{}, false
	}
	return ts[i], true
}

// TestSharedChassisReadingsPerSystem: two systems in one chassis
// (bmcsim.WriteSharedChassisTree over the DMTF tree). Each system's Info
// shows the chassis-level readings and its own sensors, never the other
// system's "CPU Temp"; those are listed in Untied.
func TestSharedChassisReadingsPerSystem(t *testing.T) {
	src, err := bmcsim.TreeDir("", treeDMTF)
	if err != nil {
		t.Fatal(err)
	}
	dst := t.TempDir()
	if err := bmcsim.WriteSharedChassisTree(src, dst); err != nil {
		t.Fatal(err)
	}
	tr, err := bmcsim.LoadTree(dst)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		system      string
		want, other string
	}{
		{"437XR1138R2", "CPU #1 Temperature", "CPU Temp"},
		{"437XR1138R2-2", "CPU Temp", "CPU #1 Temperature"},
	} {
		t.Run(tc.system, func(t *testing.T) {
			l := newLab(t, "", labOpts{on: true, tree: tr, tune: func(c *redfish.Config) { c.SystemID = tc.system }})
			in, err := l.drv.Info(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if _, ok := tempNamed(in.Temperatures, tc.want); !ok {
				t.Errorf("%s: own sensor %q missing from %+v", tc.system, tc.want, in.Temperatures)
			}
			if o, ok := tempNamed(in.Temperatures, tc.other); ok {
				t.Errorf("%s: the other system's %q shown: %+v", tc.system, tc.other, o)
			}
			if _, ok := tempNamed(in.Temperatures, "Front Panel Intake Temperature"); !ok {
				t.Errorf("%s: chassis-level intake reading missing: %+v", tc.system, in.Temperatures)
			}
			if !slices.ContainsFunc(in.Untied, func(s string) bool { return strings.Contains(s, `"`+tc.other+`"`) }) {
				t.Errorf("%s: Untied = %v, want the other system's %q listed", tc.system, in.Untied, tc.other)
			}
		})
	}
}

// The DMTF tree's current model: the Sensor says CPU #1 is 44 °C Warning
// (the deprecated Thermal said 41 OK), and the host-interface NIC
// (ToManager, AA:BB:CC:DD:EE:FE) is not among the system's MACs.
func TestInfoCurrentModelFirst(t *testing.T) {
	l := newLab(t, treeDMTF, labOpts{on: true})
	in, err := l.drv.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	cpu, ok := tempNamed(in.Temperatures, "CPU #1 Temperature")
	if !ok || cpu.Celsius != 44 || cpu.Health != "Warning" {
		t.Errorf("CPU #1 = %+v (%v), want 44 °C Warning from Sensors", cpu, ok)
	}
	if slices.Contains(in.NICMACs, "aa:bb:cc:dd:ee:fe") {
		t.Errorf("NICMACs %v include the BMC's host-interface NIC", in.NICMACs)
	}
}

// TestSingleSystemChassisKeepsMalformedRelatedItem: a chassis serving one
// System whose readings carry RelatedItem links to a System path that does
// not exist (seen on BMCs that keep a stale or renamed System Id in their
// sensor tables, or drop the /redfish/v1 prefix). Both readings are the
// System's: none is dropped or listed as untied, from Sensors and from the
// deprecated Thermal alike, whether the chassis names its one System in
// Links.ComputerSystems or names none on a BMC with one System.
func TestSingleSystemChassisKeepsMalformedRelatedItem(t *testing.T) {
	bad := []any{map[string]any{"@odata.id": "/redfish/v1/Systems/System.Embedded.1"}}
	for _, tc := range []struct {
		name      string
		computers []any // chassis Links.ComputerSystems; nil: none
		sensors   bool
	}{
		{"thermal-linked", []any{map[string]any{"@odata.id": "/redfish/v1/Systems/s0"}}, false},
		{"thermal-unlinked", nil, false},
		{"sensors-linked", []any{map[string]any{"@odata.id": "/redfish/v1/Systems/s0"}}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			files := multiSystemTree(1, false)
			files["redfish/v1/Systems/s0"].(map[string]any)["Links"] = map[string]any{"Chassis": []any{map[string]any{"@odata.id": "/redfish/v1/Chassis/c"}}}
			ch := map[string]any{"@odata.id": "/redfish/v1/Chassis/c"}
			if tc.computers != nil {
				ch["Links"] = map[string]any{"ComputerSystems": tc.computers}
			}
			if tc.sensors {
				ch["Sensors"] = map[string]any{"@odata.id": "/redfish/v1/Chassis/c/Sensors"}
				files["redfish/v1/Chassis/c/Sensors"] = map[string]any{"Members": []any{
					map[string]any{"@odata.id": "/redfish/v1/Chassis/c/Sensors/cpu"}, map[string]any{"@odata.id": "/redfish/v1/Chassis/c/Sensors/inlet"}}}
				files["redfish/v1/Chassis/c/Sensors/cpu"] = map[string]any{"Name": "CPU Temp", "ReadingType": "Temperature", "Reading": 51.0, "RelatedItem": bad}
				files["redfish/v1/Chassis/c/Sensors/inlet"] = map[string]any{"Name": "Inlet Temp", "ReadingType": "Temperature", "Reading": 22.0, "RelatedItem": bad}
			} else {
				ch["Thermal"] = map[string]any{"@odata.id": "/redfish/v1/Chassis/c/Thermal"}
				files["redfish/v1/Chassis/c/Thermal"] = map[string]any{"Temperatures": []any{
					map[string]any{"Name": "CPU Temp", "ReadingCelsius": 51.0, "RelatedItem": bad},
					map[string]any{"Name": "Inlet Temp", "ReadingCelsius": 22.0, "RelatedItem": bad},
				}}
			}
			files["redfish/v1/Chassis/c"] = ch
			writeTree(t, dir, files)
			tr, err := bmcsim.LoadTree(dir)
			if err != nil {
				t.Fatal(err)
			}
			l := newLab(t, "", labOpts{on: true, tree: tr})
			in, err := l.drv.Info(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			for _, n := range []string{"CPU Temp", "Inlet Temp"} {
				if _, ok := tempNamed(in.Temperatures, n); !ok {
					t.Errorf("%q missing: Temperatures = %+v, Untied = %v", n, in.Temperatures, in.Untied)
				}
			}
			if len(in.Untied) != 0 || slices.Contains(in.Missing, redfish.SectionTemperatures) {
				t.Errorf("Untied = %v, Missing = %v; want none and temperatures present", in.Untied, in.Missing)
			}
		})
	}
}
