package redfish

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

// FuzzTolerantDecode feeds arbitrary JSON to every decoder the driver runs
// on BMC bodies; none may panic, whatever the types.
func FuzzTolerantDecode(f *testing.F) {
	for _, s := range []string{
		`{"PowerState":"On","Boot":{"BootSourceOverrideTarget":"Pxe","BootSourceOverrideEnabled":"Once"}}`,
		`{"Temperatures":[{"Name":"CPU","ReadingCelsius":"N/A"},{"Name":5,"ReadingCelsius":40}]}`,
		`{"PowerControl":[{"PowerConsumedWatts":""}],"PowerWatts":{"Reading":12.5}}`,
		`{"Actions":{"#ComputerSystem.Reset":{"target":7,"ResetType@Redfish.AllowableValues":"GracefulShutdownGracefulRestart"}}}`,
		`{"Inserted":"yes","ConnectedVia":1,"Image":null,"Members":[1,{"@odata.id":2}]}`,
		`{"Members":[{"Created":"TIME_NA","Message":"x","Severity":3}]}`,
	} {
		f.Add([]byte(s))
	}
	// Real bodies from the fixture trees as further seeds.
	for _, p := range []string{
		"../../testdata/fixtures/redfish/dell-poweredge-r750-idrac9/redfish/v1/Systems/System.Embedded.1/index.json",
		"../../testdata/fixtures/redfish/hpe-proliant-dl385gen10plusv2-ilo5/redfish/v1/Chassis/1/Thermal/index.json",
	} {
		if b, err := os.ReadFile(filepath.FromSlash(p)); err == nil {
			f.Add(b)
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > 1<<16 {
			return
		}
		var m map[string]any
		if json.Unmarshal(data, &m) != nil {
			return
		}
		_ = powerOf(m)
		_ = tempsFrom(m)
		_ = thermalMetricsFrom(m)
		_ = powerControlWatts(m)
		_ = envWatts(m)
		_ = members(m)
		_ = slot{body: m}.inserted()
		_, _ = slot{body: m}.action("InsertMedia")
		_ = extendedError("", "fuzz", &response{status: 200, body: m})
		_ = bootFrom(m)
		_ = parseTime(strv(m, "Created"))
		_ = normMAC(strv(m, "MACAddress"))
		_ = normETag(strv(m, "@odata.etag"))
		ms, _ := m["Members"].([]any)
		for _, e := range ms {
			if em, ok := e.(map[string]any); ok {
				_, _ = entryFrom(em)
			}
		}
		act := obj(obj(m, "Actions"), "#ComputerSystem.Reset")
		if v, ok := strList(act, "ResetType@Redfish.AllowableValues"); ok {
			_ = resetAction{allowed: v, known: true}.choose(rtCycle)
		}
	})
}

// FuzzProjectSystem: for any input, projectSystem is nil exactly when
// decodeObject is, and otherwise holds exactly the stateProps of the
// whole decode, with equal values (escaped keys, duplicates, nesting and
// white space included).
func FuzzProjectSystem(f *testing.F) {
	for _, s := range []string{
		`{"PowerState":"On","Boot":{"BootSourceOverrideTarget":"Pxe","BootSourceOverrideEnabled":"Once"}}`,
		`{"Oem":{"x":[1,{"y":"}]\"{"}]},"\u0050owerState":"Off","PowerState":null,"Boot":[],"Actions":"x"}`,
		` { "LastResetTime" : "2026-12-07T00:00:00Z" , "BootProgress" : { "LastState" : "OSRunning" } } `,
		`null`, `[]`, `{}`, `{"Boot":1e3,"Manufacturer":true}`,
	} {
		f.Add([]byte(s))
	}
	if b, err := os.ReadFile(filepath.FromSlash("../../testdata/fixtures/redfish/dell-poweredge-r750-idrac9/redfish/v1/Systems/System.Embedded.1/index.json")); err == nil {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > 1<<16 {
			return
		}
		whole, proj := decodeObject(data), projectSystem(data)
		if (whole == nil) != (proj == nil) {
			t.Fatalf("decodeObject nil %v, projectSystem nil %v", whole == nil, proj == nil)
		}
		if whole == nil {
			return
		}
		if want := stateSubset(whole); !reflect.DeepEqual(proj, want) {
			t.Fatalf("projectSystem = %v, want %v", proj, want)
		}
	})
}
