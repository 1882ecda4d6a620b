package redfish_test

import (
	"context"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/machina-metal/machina/bmc"
	"github.com/machina-metal/machina/bmc/bmcsim"
	"github.com/machina-metal/machina/bmc/redfish"
)

// TestInfoPerTree reads the model from every tree and checks identity
// against the fixture files, section counts, and the Missing list.
func TestInfoPerTree(t *testing.T) {
	type want struct {
		manufacturer, serial, bmcFW, health string
		missing                             []string
		minNICs, minTemps, minFW, logs      int
		watts                               float64 // 0: not reported
	}
	cases := map[string]want{
		// Values below are read off the fixture files named in the key.
		// Current model first: EnvironmentMetrics says 374 W
		// where the deprecated Power says 344; the host-interface NIC
		// (ToManager) is not a system NIC.
		treeDMTF:       {manufacturer: "Contoso", serial: "437XR1138R2", bmcFW: "1.45.455b66-rev4", health: "Warning", minNICs: 2, minTemps: 2, minFW: 2, logs: 2, watts: 374},
		treeDell:       {manufacturer: "Dell Inc.", serial: "CNIVC0014M0388", bmcFW: "6.00.30.00", health: "OK", minNICs: 5, minTemps: 2, minFW: 10, logs: 5, watts: 614},
		treeHPE:        {manufacturer: "HPE", serial: "MXQ302099S", bmcFW: "iLO 5 v2.72", health: "Critical", minNICs: 7, minTemps: 2, minFW: 2, logs: 5, watts: 531},
		treeLenovo:     {manufacturer: "Lenovo", serial: "J105958B", bmcFW: "TGBT42S 2.83 2023-07-05", health: "OK", minNICs: 4, minTemps: 2, minFW: 2, logs: 5, watts: 700},
		treeSupermicro: {manufacturer: "Supermicro", serial: "S889914X3710910", bmcFW: "11.01.01", health: "OK", minNICs: 11, minTemps: 2, minFW: 50, logs: 20, watts: 2161},
		// Stock bmcweb: no inventory (Manufacturer null), no
		// EthernetInterfaces link, empty Thermal, PowerControl without a
		// reading.
		treeOpenBMC: {bmcFW: "2.15.0-dev-686-g100c36de90", health: "OK", minFW: 1, logs: 20,
			missing: []string{redfish.SectionIdentity, redfish.SectionNICs, redfish.SectionTemperatures, redfish.SectionPower}},
	}
	for _, tr := range allTrees {
		t.Run(tr, func(t *testing.T) {
			w := cases[tr]
			l := newLab(t, tr, labOpts{on: true})
			in, err := l.drv.Info(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if in.Manufacturer != w.manufacturer || in.Serial != w.serial || in.BMCFirmware != w.bmcFW || in.Health != w.health {
				t.Errorf("identity = %q %q %q health %q; want %q %q %q %q", in.Manufacturer, in.Serial, in.BMCFirmware, in.Health, w.manufacturer, w.serial, w.bmcFW, w.health)
			}
			if diff := cmp.Diff(w.missing, in.Missing); diff != "" {
				t.Errorf("Missing (-want +got):\n%s", diff)
			}
			if len(in.NICMACs) < w.minNICs || len(in.Temperatures) < w.minTemps || len(in.Firmware) < w.minFW || len(in.Logs) != w.logs {
				t.Errorf("counts nics %d temps %d fw %d logs %d; want >=%d >=%d >=%d ==%d", len(in.NICMACs), len(in.Temperatures), len(in.Firmware), len(in.Logs), w.minNICs, w.minTemps, w.minFW, w.logs)
			}
			if w.watts == 0 && in.PowerWatts != nil || w.watts != 0 && (in.PowerWatts == nil || *in.PowerWatts != w.watts) {
				t.Errorf("PowerWatts = %v, want %v", in.PowerWatts, w.watts)
			}
			if tr == treeHPE {
				// The HPE tree's Thermal lists unpopulated sensors
				// ("25-HD Controller", ...) as State "Absent" with
				// ReadingCelsius 0: not readings.
				temps := map[string]float64{}
				for _, tp := range in.Temperatures {
					temps[tp.Name] = tp.Celsius
				}
				for _, absent := range []string{"25-HD Controller", "26-HD Cntlr Zone", "48-Mid HD Max", "66-Exp Bay Rear"} {
					if c, ok := temps[absent]; ok {
						t.Errorf("absent sensor %q shown as %v °C", absent, c)
					}
				}
				if c, ok := temps["02-CPU 1"]; !ok || c != 40 {
					t.Errorf("02-CPU 1 = %v (%v), want 40", c, ok)
				}
			}
			for i := 1; i < len(in.Logs); i++ {
				if in.Logs[i].Created.After(in.Logs[i-1].Created) {
					t.Errorf("logs not newest first at %d", i)
				}
			}
			for _, r := range l.sim.Requests() {
				if r.Method != "GET" && r.Method != "POST" && r.Method != "DELETE" {
					t.Errorf("Info sent a write: %v", r)
				}
			}
		})
	}
}

// TestTolerantDecoding serves a System whose fields have the wrong types;
// the read model marks them unknown and the driver keeps working.
func TestTolerantDecoding(t *testing.T) {
	dir := t.TempDir()
	files := multiSystemTree(1, false)
	sys := files["redfish/v1/Systems/s0"].(map[string]any)
	sys["SerialNumber"] = 12345 // number where a string belongs
	sys["UUID"] = ""            // empty
	sys["Links"] = map[string]any{"Chassis": []any{map[string]any{"@odata.id": "/redfish/v1/Chassis/c"}}}
	sys["EthernetInterfaces"] = map[string]any{"@odata.id": "/redfish/v1/Systems/s0/EthernetInterfaces"}
	files["redfish/v1/Systems/s0/EthernetInterfaces"] = map[string]any{"Members": []any{map[string]any{"@odata.id": "/redfish/v1/Systems/s0/EthernetInterfaces/1"}, "junk", 7}}
	files["redfish/v1/Systems/s0/EthernetInterfaces/1"] = map[string]any{"MACAddress": "AA-BB-CC-DD-EE-FF"}
	files["redfish/v1/Chassis/c"] = map[string]any{"Thermal": map[string]any{"@odata.id": "/redfish/v1/Chassis/c/Thermal"}, "Power": map[string]any{"@odata.id": "/redfish/v1/Chassis/c/Power"}}
	files["redfish/v1/Chassis/c/Thermal"] = map[string]any{"Temperatures": []any{
		map[string]any{"Name": "Inlet", "ReadingCelsius": "N/A"},
		map[string]any{"Name": "CPU", "ReadingCelsius": ""},
		map[string]any{"Name": "DIMM", "ReadingCelsius": 33.5, "Status": "weird"},
		map[string]any{"Name": "PSU", "ReadingCelsius": nil},
		map[string]any{"Name": "Riser"},
		map[string]any{"Name": "HD Controller", "ReadingCelsius": 0, "Status": map[string]any{"State": "Absent"}},
	}}
	files["redfish/v1/Chassis/c/Power"] = map[string]any{"PowerControl": []any{map[string]any{"PowerConsumedWatts": "N/A"}}}
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
	if in.Manufacturer != "" || in.Serial != "" || in.Model != "Synthetic" {
		t.Errorf("identity = %q %q %q; want wrong-typed fields unknown", in.Manufacturer, in.Serial, in.Model)
	}
	if diff := cmp.Diff([]string{"aa:bb:cc:dd:ee:ff"}, in.NICMACs); diff != "" {
		t.Errorf("NICMACs (-want +got):\n%s", diff)
	}
	if len(in.Temperatures) != 1 || in.Temperatures[0].Celsius != 33.5 || in.Temperatures[0].Health != "" {
		t.Errorf("Temperatures = %+v, want only DIMM 33.5", in.Temperatures)
	}
	if diff := cmp.Diff([]string{redfish.SectionPower, redfish.SectionFirmware, redfish.SectionLogs}, in.Missing); diff != "" {
		t.Errorf("Missing (-want +got):\n%s", diff)
	}
	if in.Health != "Warning" {
		t.Errorf("Health = %q", in.Health)
	}
}

func TestTemperaturesFromThermalMetrics(t *testing.T) {
	// A chassis with only the newer ThermalSubsystem model.
	dir := t.TempDir()
	files := multiSystemTree(1, false)
	files["redfish/v1/Systems/s0"].(map[string]any)["Links"] = map[string]any{"Chassis": []any{map[string]any{"@odata.id": "/redfish/v1/Chassis/c"}}}
	files["redfish/v1/Chassis/c"] = map[string]any{"ThermalSubsystem": map[string]any{"@odata.id": "/redfish/v1/Chassis/c/ThermalSubsystem"}}
	files["redfish/v1/Chassis/c/ThermalSubsystem"] = map[string]any{"ThermalMetrics": map[string]any{"@odata.id": "/redfish/v1/Chassis/c/ThermalSubsystem/ThermalMetrics"}}
	files["redfish/v1/Chassis/c/ThermalSubsystem/ThermalMetrics"] = map[string]any{"TemperatureReadingsCelsius": []any{
		map[string]any{"DeviceName": "Intake", "Reading": 24.8}, map[string]any{"DeviceName": "Exhaust", "Reading": "N/A"},
	}}
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
	if diff := cmp.Diff([]bmc.Temperature{{Name: "Intake", Celsius: 24.8}}, in.Temperatures); diff != "" {
		t.Errorf("Temperatures (-want +got):\n%s", diff)
	}
}

// TestHealthPerTree: the cheap health read agrees with Info's health and
// power on every vendor tree, and once the System is resolved it costs one
// GET (besides a session login when the BMC's table expired it).
func TestHealthPerTree(t *testing.T) {
	for _, tr := range allTrees {
		t.Run(tr, func(t *testing.T) {
			l := newLab(t, tr, labOpts{on: true})
			ctx := context.Background()
			in, err := l.drv.Info(ctx)
			if err != nil {
				t.Fatal(err)
			}
			var hr bmc.HealthReader = l.drv
			l.sim.ClearRequests()
			p, h, err := hr.Health(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if p != in.Power || h != in.Health {
				t.Errorf("Health = %s %q; Info says %s %q", p, h, in.Power, in.Health)
			}
			var gets []string
			for _, r := range l.sim.Requests() {
				if r.Method != "GET" {
					t.Errorf("Health sent %s %s", r.Method, r.Path)
				}
				gets = append(gets, r.Path)
			}
			if len(gets) != 1 {
				t.Errorf("Health made %d requests, want one GET of the System: %q", len(gets), gets)
			}
		})
	}
}
