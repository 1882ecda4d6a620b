package redfish

import "strings"

// Quirk is how the driver adapts to one vendor's reading of Redfish. Quirks
// are data, looked up by manufacturer; the code paths they switch are the
// same for every vendor. Behaviours the driver handles for every BMC (no
// session service, Once coerced or ignored, no reset evidence, shared
// chassis, host-interface NICs) are listed per fixture tree, with the
// bmcsim mode reproducing each, in docs/bmc-quirks.md.
type Quirk struct {
	// Vendor is a lower-case prefix of the System's Manufacturer
	// ("" matches BMCs that report none, e.g. stock OpenBMC).
	Vendor string
	// SendBootModeAlways sends BootSourceOverrideMode on every boot PATCH
	// (the wanted mode, or the current one): the BMC reverts the mode to a
	// default when the property is left out.
	SendBootModeAlways bool
	// BootModeReadOnly never sends BootSourceOverrideMode: the BMC answers
	// 400 to any PATCH that carries it, even with the current value, so a
	// mode change is bmc.ErrUnsupported before anything is sent (the mode
	// is then a BIOS setting).
	BootModeReadOnly bool
	// SendIfMatch sends If-Match on the first PATCH instead of waiting for
	// a 428: the BMC requires it on every PATCH.
	SendIfMatch bool
	// BIOSConfigJobs is the Jobs collection a BIOS settings write must be
	// committed to with a POST of {"TargetSettingsURI": settings object}
	// when the Bios lists no SupportedApplyTimes: Dell iDRAC applies
	// pending BIOS settings only through a configuration job (JID_...),
	// never at a plain reset. iDRAC9 4.x and later list
	// SupportedApplyTimes and make the job from @Redfish.SettingsApplyTime
	// (answering 202 with the job's Location), so the POST is not needed.
	// HPE iLO 5, Lenovo XCC and Supermicro keep pending settings in the
	// settings object (bios/settings, Bios/Pending, Bios/SD) and apply
	// them at the next reset with no job.
	BIOSConfigJobs string
	// Evidence names the fixture tree and the test that show the quirk.
	Evidence string
}

// quirkTable is the vendor quirk table. Order matters: first prefix match wins.
var quirkTable = []Quirk{
	{Vendor: "hpe", BootModeReadOnly: true,
		Evidence: "hpe-proliant-dl385gen10plusv2-ilo5; TestVendorMatrix/hpe*/boot-cd-legacy; iLO 400 on PATCH with BootSourceOverrideMode"},
	{Vendor: "supermicro", SendBootModeAlways: true,
		Evidence: "supermicro-sys821ge-tnhr-x13; TestVendorMatrix/supermicro*/boot-*, TestBootModeRevertCaught"},
	{Vendor: "lenovo", SendIfMatch: true,
		Evidence: "lenovo-thinksystem-sr670v2-xcc (strong @odata.etag on every resource); TestVendorMatrix/lenovo*/boot-*"},
	{Vendor: "dell", BIOSConfigJobs: "/redfish/v1/Managers/iDRAC.Embedded.1/Jobs",
		Evidence: "dell-poweredge-r750-idrac9 (ETag header only; VirtualMedia under the System); TestVendorMatrix/dell*; BIOS jobs: TestDellOlderFirmwarePostsJob, TestBIOSSettingsPendingUntilReset/dell*"},
}

// quirkFor returns the table entry for manufacturer, or the zero Quirk.
func quirkFor(manufacturer string) Quirk {
	m := strings.ToLower(strings.TrimSpace(manufacturer))
	for _, q := range quirkTable {
		if q.Vendor != "" && strings.HasPrefix(m, q.Vendor) {
			return q
		}
	}
	return Quirk{}
}
