package redfish

import "testing"

func TestQuirkTable(t *testing.T) {
	for _, q := range quirkTable {
		if q.Vendor == "" || q.Evidence == "" {
			t.Errorf("row %+v: every row needs a vendor prefix and the fixture/test that shows it", q)
		}
	}
	// Manufacturer strings as the fixture trees report them.
	for _, tc := range []struct {
		manufacturer string
		want         Quirk
	}{
		{"HPE", Quirk{BootModeReadOnly: true}},
		{"Supermicro", Quirk{SendBootModeAlways: true}},
		{"Lenovo", Quirk{SendIfMatch: true}},
		{"Dell Inc.", Quirk{BIOSConfigJobs: "/redfish/v1/Managers/iDRAC.Embedded.1/Jobs"}},
		{"Contoso", Quirk{}},
		{"", Quirk{}},
	} {
		got := quirkFor(tc.manufacturer)
		got.Vendor, got.Evidence = "", ""
		if got != tc.want {
			t.Errorf("quirkFor(%q) = %+v, want %+v", tc.manufacturer, got, tc.want)
		}
	}
}
