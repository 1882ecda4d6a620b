package plan

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/state"
)

func i64(n int64) *int64 { return &n }

// idracRead is a firmware read shaped like a Dell iDRAC 9 (PowerEdge R750,
// testdata/fixtures): attribute names, types and bounds of its
// BiosAttributeRegistry, a PERC with four SSDs and two HDDs and no
// volume, its firmware inventory, Secure Boot off.
func idracRead() *state.Firmware {
	const gib = int64(1) << 30
	return &state.Firmware{
		ReadAt: planT0,
		BIOS: &state.FirmwareBIOS{
			Attributes: state.NewBIOSValues(map[string]any{"ProcVirtualization": "Disabled", "BootMode": "Uefi", "AcPwrRcvryUserDelay": float64(120),
				"SystemServiceTag": "F54P1G3", "AssetTag": "", "SriovGlobalEnable": "Disabled"}),
			RegistryID: "BiosAttributeRegistry.v1_0_3",
			Registry: []state.BIOSAttribute{ // sorted by Name
				{Name: "AcPwrRcvryUserDelay", Type: "Integer", Min: i64(60), Max: i64(240), ResetRequired: true},
				{Name: "AssetTag", Type: "String", Min: i64(0), Max: i64(10), ResetRequired: true},
				{Name: "BootMode", Type: "Enumeration", Values: []string{"Bios", "Uefi"}, ResetRequired: true},
				{Name: "ProcVirtualization", Type: "Enumeration", Values: []string{"Enabled", "Disabled"}, ResetRequired: true},
				{Name: "SriovGlobalEnable", Type: "Enumeration", Values: []string{"Enabled", "Disabled"}, ResetRequired: true},
				{Name: "SystemServiceTag", Type: "String", ReadOnly: true},
			},
			ApplyTimes: []string{"Immediate", "OnReset", "AtMaintenanceWindowStart", "InMaintenanceWindowOnReset"},
		},
		Storage: []state.StorageController{
			{ID: "AHCI.Embedded.1-1"},
			{ID: "RAID.Integrated.1-1", CanCreateVolumes: true, RAIDTypes: []string{"RAID0", "RAID1", "RAID5", "RAID6", "RAID10"},
				Drives: []state.StorageDrive{
					{ID: "Disk.Bay.0:Enclosure.Internal.0-1:RAID.Integrated.1-1", CapacityBytes: 960 * gib, MediaType: "SSD"},
					{ID: "Disk.Bay.1:Enclosure.Internal.0-1:RAID.Integrated.1-1", CapacityBytes: 480 * gib, MediaType: "SSD"},
					{ID: "Disk.Bay.2:Enclosure.Internal.0-1:RAID.Integrated.1-1", CapacityBytes: 480 * gib, MediaType: "SSD"},
					{ID: "Disk.Bay.3:Enclosure.Internal.0-1:RAID.Integrated.1-1", CapacityBytes: 960 * gib, MediaType: "SSD"},
					{ID: "Disk.Bay.4:Enclosure.Internal.0-1:RAID.Integrated.1-1", CapacityBytes: 4000 * gib, MediaType: "HDD"},
					{ID: "Disk.Bay.5:Enclosure.Internal.0-1:RAID.Integrated.1-1", CapacityBytes: 4000 * gib, MediaType: "HDD"},
				}},
		},
		Components: []state.FirmwareComponent{
			{ID: "Installed-159-1.10.2__BIOS.Setup.1-1", Name: "BIOS", Version: "1.10.2", Updateable: true},
			{ID: "Installed-25227-6.10.80.00__iDRAC.Embedded.1-1", Name: "Integrated Dell Remote Access Controller", Version: "6.10.80.00", Updateable: true},
			{ID: "Installed-0-1.0__TPM.Integrated.1-1", Name: "TPM", Version: "1.3.2.8", Updateable: false},
		},
		SecureBoot: &state.SecureBootState{Enable: false, CurrentBoot: "Disabled"},
	}
}

func redfishServer(name string) *inventory.Server {
	return &inventory.Server{Name: name, BMC: inventory.BMC{Driver: inventory.DriverRedfish, Address: "https://10.0.0.1", Credentials: "c"}}
}

func boolp(b bool) *bool { return &b }

// goodFirmware is a firmware block idracRead can take.
func goodFirmware() *inventory.Firmware {
	return &inventory.Firmware{
		Settings:   map[string]any{"ProcVirtualization": "Enabled", "BootMode": "Uefi", "AcPwrRcvryUserDelay": float64(120)},
		RAID:       []inventory.RAIDVolume{{Name: "os", Level: inventory.RAID1, Drives: inventory.DriveSelector{Count: 2, MediaType: "SSD", MinSizeGiB: 400}, Size: "all"}},
		Versions:   []inventory.FirmwareVersion{{Component: "BIOS", Version: "1.13.2", Image: "bios"}},
		SecureBoot: boolp(true),
	}
}

// TestCheckFirmwareRefusals: every way a profile's firmware block is
// refused on a machine, each as the condition type and reason the plan
// shows, with the allowed values named; a refused block plans no change
// at all (nothing is sent to the BMC).
func TestCheckFirmwareRefusals(t *testing.T) {
	long := strings.Repeat("x", 11)
	tests := []struct {
		name        string
		fw          func(*inventory.Firmware)
		read        func(*state.Firmware)
		server      *inventory.Server
		typ, reason string
		msg         string
	}{
		{name: "unknown attribute", fw: func(f *inventory.Firmware) { f.Settings["Turbo"] = "Enabled" },
			typ: CondFirmwareSettingInvalid, reason: "UnknownAttribute", msg: "BIOS attribute Turbo is not in the machine's attribute registry"},
		{name: "wrong type", fw: func(f *inventory.Firmware) { f.Settings["ProcVirtualization"] = true },
			typ: CondFirmwareSettingInvalid, reason: "WrongType", msg: "BIOS attribute ProcVirtualization: value true is not of type Enumeration (allowed: Enabled, Disabled)"},
		{name: "not in list", fw: func(f *inventory.Firmware) { f.Settings["ProcVirtualization"] = "On" },
			typ: CondFirmwareSettingInvalid, reason: "NotInList", msg: `BIOS attribute ProcVirtualization: value "On" not allowed (allowed: Enabled, Disabled)`},
		{name: "integer out of range", fw: func(f *inventory.Firmware) { f.Settings["AcPwrRcvryUserDelay"] = float64(30) },
			typ: CondFirmwareSettingInvalid, reason: "OutOfRange", msg: "BIOS attribute AcPwrRcvryUserDelay: value 30 out of range (allowed: 60..240)"},
		{name: "integer given as string", fw: func(f *inventory.Firmware) { f.Settings["AcPwrRcvryUserDelay"] = "90" },
			typ: CondFirmwareSettingInvalid, reason: "WrongType", msg: "value 90 is not of type Integer (allowed: 60..240)"},
		{name: "string too long", fw: func(f *inventory.Firmware) { f.Settings["AssetTag"] = long },
			typ: CondFirmwareSettingInvalid, reason: "OutOfRange", msg: "BIOS attribute AssetTag: value of length 11 out of range (allowed: a string of length 0..10)"},
		{name: "read-only", fw: func(f *inventory.Firmware) { f.Settings["SystemServiceTag"] = "ABC" },
			typ: CondFirmwareSettingInvalid, reason: "ReadOnly", msg: "BIOS attribute SystemServiceTag is read-only"},
		{name: "raid without a controller that creates volumes", read: func(r *state.Firmware) { r.Storage = r.Storage[:1] },
			typ: CondFirmwareRAIDInvalid, reason: "NoController", msg: "no storage controller of the machine can create volumes (volume os)"},
		{name: "raid level not supported", read: func(r *state.Firmware) { r.Storage[1].RAIDTypes = []string{"RAID0", "RAID5"} },
			typ: CondFirmwareRAIDInvalid, reason: "LevelNotSupported", msg: "controller RAID.Integrated.1-1 cannot create RAID1 (it supports RAID0, RAID5)"},
		{name: "raid not enough drives", fw: func(f *inventory.Firmware) {
			f.RAID[0].Drives.MinSizeGiB = 900
			f.RAID[0].Drives.Count = 3
			f.RAID[0].Level = "RAID5"
		},
			typ: CondFirmwareRAIDInvalid, reason: "NotEnoughDrives", msg: "controller RAID.Integrated.1-1 has 2 free drives (SSD, at least 900 GiB); volume os needs 3"},
		{name: "raid too large", fw: func(f *inventory.Firmware) { f.RAID[0].Size = "1TiB" },
			typ: CondFirmwareRAIDInvalid, reason: "TooLarge", msg: "volume os asks 1TiB; RAID1 over 2 drives of controller RAID.Integrated.1-1 offers 480 GiB"},
		{name: "raid volume exists with another level", read: func(r *state.Firmware) {
			r.Storage[1].Volumes = []state.Volume{{ID: "Disk.Virtual.0:RAID.Integrated.1-1", Name: "os", RAIDType: "RAID5"}}
		}, typ: CondFirmwareRAIDInvalid, reason: "VolumeDiffers", msg: "volume os exists on RAID.Integrated.1-1 as RAID5; the profile wants RAID1"},
		{name: "unknown component", fw: func(f *inventory.Firmware) { f.Versions[0].Component = "CPLD" },
			typ: CondFirmwareVersionInvalid, reason: "UnknownComponent", msg: "component CPLD is not in the firmware inventory (it lists: Installed-159-1.10.2__BIOS.Setup.1-1 (BIOS)"},
		{name: "component not updateable", fw: func(f *inventory.Firmware) {
			f.Versions[0] = inventory.FirmwareVersion{Component: "TPM", Version: "7.2"}
		},
			typ: CondFirmwareVersionInvalid, reason: "NotUpdateable", msg: "component TPM runs 1.3.2.8 and the BMC says it is not updateable (profile wants 7.2)"},
		{name: "ipmi", server: &inventory.Server{Name: "n1", BMC: inventory.BMC{Driver: inventory.DriverIPMI, Address: "10.0.0.3", Credentials: "c"}},
			typ: CondFirmwareUnsupported, reason: "IPMI", msg: "the profile sets firmware state (bios, raid, versions, secureBoot) and the server's BMC is IPMI"},
		{name: "no bmc", server: &inventory.Server{Name: "n1"},
			typ: CondFirmwareUnsupported, reason: "NoBMC", msg: "the server has no BMC"},
		{name: "area missing", read: func(r *state.Firmware) {
			r.SecureBoot = nil
			r.Unsupported = map[string]string{"secureBoot": "no SecureBoot resource"}
		},
			typ: CondFirmwareUnsupported, reason: "AreaMissing", msg: "the profile sets firmware secureBoot and the BMC cannot: no SecureBoot resource"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fw, read, ws := goodFirmware(), idracRead(), redfishServer("n1")
			if tt.fw != nil {
				tt.fw(fw)
			}
			if tt.read != nil {
				tt.read(read)
			}
			if tt.server != nil {
				ws = tt.server
			}
			got := CheckFirmware(nil, fw, ws, &state.Server{Name: ws.Name, Firmware: read})
			if len(got.Refusals) != 1 {
				t.Fatalf("refusals = %+v; want one %s", got.Refusals, tt.typ)
			}
			c := got.Refusals[0]
			if c.Subject != "server/n1" || c.Type != tt.typ || c.Reason != tt.reason || !strings.Contains(c.Message, tt.msg) {
				t.Errorf("refusal = %+v;\nwant %s/%s with %q", c, tt.typ, tt.reason, tt.msg)
			}
			if len(got.Changes) != 0 {
				t.Errorf("a refused block planned changes: %v", got.Changes)
			}
		})
	}
}

// TestCheckFirmwareChanges: a block the machine can take plans exactly
// the differences (a setting already in effect or pending is no change;
// RAID members are the smallest fitting drives), and once the read-back
// matches, nothing (the check is what the step's idempotence rests on).
func TestCheckFirmwareChanges(t *testing.T) {
	ws := redfishServer("r1-n01")
	read := idracRead()
	read.BIOS.Pending = map[string]any{"SriovGlobalEnable": "Enabled"}
	fw := goodFirmware()
	fw.Settings["SriovGlobalEnable"] = "Enabled"
	got := CheckFirmware(nil, fw, ws, &state.Server{Firmware: read})
	var lines []string
	for _, c := range got.Changes {
		lines = append(lines, c.String())
	}
	want := []string{
		"bios-set r1-n01 ProcVirtualization Disabled -> Enabled",
		"raid-create r1-n01 os (none) -> RAID1 all on RAID.Integrated.1-1 (Disk.Bay.1:Enclosure.Internal.0-1:RAID.Integrated.1-1, Disk.Bay.2:Enclosure.Internal.0-1:RAID.Integrated.1-1)",
		"firmware-update r1-n01 BIOS 1.10.2 -> 1.13.2",
		"secureboot-set r1-n01 false -> true",
	}
	if d := cmp.Diff(want, lines); d != "" || len(got.Refusals) > 0 || got.NotRead {
		t.Errorf("changes (-want +got):\n%s\nrefusals %v", d, got.Refusals)
	}

	// The machine after the step: everything read back as asked.
	read.BIOS.Attributes = read.BIOS.Attributes.With("ProcVirtualization", "Enabled")
	read.Storage[1].Volumes = []state.Volume{{ID: "Disk.Virtual.0:RAID.Integrated.1-1", Name: "os", RAIDType: "RAID1"}}
	read.Components[0].Version = "1.13.2"
	read.SecureBoot.Enable = true
	if got := CheckFirmware(nil, fw, ws, &state.Server{Firmware: read}); len(got.Changes) != 0 || len(got.Refusals) != 0 {
		t.Errorf("after the read-back matched: changes %v, refusals %v; want none", got.Changes, got.Refusals)
	}
	if got := CheckFirmware(nil, fw, ws, &state.Server{}); !got.NotRead || len(got.Changes) != 0 {
		t.Errorf("never read: %+v; want NotRead and no change", got)
	}
	if got := CheckFirmware(nil, nil, ws, &state.Server{Firmware: read}); len(got.Changes)+len(got.Refusals) != 0 || got.NotRead {
		t.Errorf("no firmware block: %+v; want nothing", got)
	}
}

// TestPlanFirmwareGolden: the example fleet with a firmware block on the
// hypervisor profile, count raised to 3: the deployed r1-n01 shows its
// differences as held changes, r1-n02 (matching) none; r1-n03, pinned
// and allocated, has a registry that refuses a setting, so it gets
// FirmwareSettingInvalid and no deploy step; r1-n04, pinned and
// allocated on IPMI, gets FirmwareUnsupported and no deploy; the third
// count slot is not filled with r1-n05 (ready, IPMI): it is not a
// candidate, and the profile is short of capacity.
func TestPlanFirmwareGolden(t *testing.T) {
	inv := cloneInv(exampleInventory(t))
	hv := inv.Profile("hypervisor")
	hv.Count = 3
	hv.Firmware = goodFirmware()
	for _, n := range []string{"r1-n03", "r1-n04"} {
		inv.Server(n).Want, inv.Server(n).Profile = inventory.WantDeployed, "hypervisor"
	}
	snap := steadyFleet(inv)
	matching := idracRead()
	matching.BIOS.Attributes = matching.BIOS.Attributes.With("ProcVirtualization", "Enabled")
	matching.Storage[1].Volumes = []state.Volume{{ID: "Disk.Virtual.0:RAID.Integrated.1-1", Name: "os", RAIDType: "RAID1"}}
	matching.Components[0].Version = "1.13.2"
	matching.SecureBoot.Enable = true
	refusing := idracRead()
	refusing.BIOS.Registry[3].Values = []string{"Enabled"} // ProcVirtualization: a BIOS that cannot turn it off has no Disabled value
	refusing.BIOS.Registry = refusing.BIOS.Registry[:3]    // ... nor, here, the attribute at all
	for name, fw := range map[string]*state.Firmware{"r1-n01": idracRead(), "r1-n02": matching, "r1-n03": refusing} {
		s := snap.Servers[name]
		s.Firmware = fw
		snap.Servers[name] = s
	}
	for _, n := range []string{"r1-n03", "r1-n04"} {
		setLC(snap, n, state.LifecycleAllocated, &state.Allocation{Profile: "hypervisor", Reason: ReasonPinned, At: planT0})
	}
	res := Compute(inv, snap, Options{Now: planT0.Add(time.Minute)})
	for _, s := range res.Steps {
		if s.Action == ActDeploy && (s.Server == "r1-n03" || s.Server == "r1-n04") {
			t.Errorf("deploy planned on %s, whose firmware block is refused", s.Server)
		}
		if s.Action == ActAllocate && s.Server == "r1-n05" {
			t.Errorf("r1-n05 (IPMI) allocated to a profile with a firmware block")
		}
	}
	got := res.Text()
	golden := filepath.Join("testdata", "firmware-refusals-and-changes.golden")
	if *updatePlans {
		if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run with -update-plans)", err)
	}
	if got != string(b) {
		t.Errorf("Compute =\n%s\nwant\n%s", got, b)
	}
}

// TestPlanFirmwareStep: an allocated server whose profile's firmware
// block differs from its read (or was never read) gets ActFirmware and no
// deploy; once the read-back matches, the deploy; a ready server being
// allocated in this plan is allocated but not deployed in the same pass.
func TestPlanFirmwareStep(t *testing.T) {
	inv := cloneInv(exampleInventory(t))
	inv.Profile("hypervisor").Firmware = goodFirmware()
	inv.Server("r1-n03").Want, inv.Server("r1-n03").Profile = inventory.WantDeployed, "hypervisor"
	matching := idracRead()
	matching.BIOS.Attributes = matching.BIOS.Attributes.With("ProcVirtualization", "Enabled")
	matching.Storage[1].Volumes = []state.Volume{{ID: "Disk.Virtual.0:RAID.Integrated.1-1", Name: "os", RAIDType: "RAID1"}}
	matching.Components[0].Version = "1.13.2"
	matching.SecureBoot.Enable = true
	steps := func(lc state.Lifecycle, fw *state.Firmware) []string {
		snap := steadyFleet(inv)
		s := snap.Servers["r1-n03"]
		s.Firmware = fw
		snap.Servers["r1-n03"] = s
		if lc == state.LifecycleAllocated {
			setLC(snap, "r1-n03", lc, &state.Allocation{Profile: "hypervisor", Reason: ReasonPinned, At: planT0})
		}
		var out []string
		for _, st := range Compute(inv, snap, Options{Now: planT0.Add(time.Minute)}).Steps {
			if st.Server == "r1-n03" {
				out = append(out, string(st.Action))
			}
		}
		return out
	}
	for _, tt := range []struct {
		name string
		lc   state.Lifecycle
		fw   *state.Firmware
		want []string
	}{
		{"allocated, differs", state.LifecycleAllocated, idracRead(), []string{"firmware"}},
		{"allocated, never read", state.LifecycleAllocated, nil, []string{"firmware"}},
		{"allocated, matches", state.LifecycleAllocated, matching, []string{"deploy"}},
		{"ready, differs", state.LifecycleReady, idracRead(), []string{"allocate"}},
		{"ready, matches", state.LifecycleReady, matching, []string{"allocate", "deploy"}},
	} {
		if got := steps(tt.lc, tt.fw); !cmp.Equal(got, tt.want) {
			t.Errorf("%s: steps %v, want %v", tt.name, got, tt.want)
		}
	}
}

// TestPlanFirmwareDeployedNeedsApproval: a profile's firmware block
// changed after r1-n01 was deployed with it. Applying needs a reset of
// the running host, so the firmware step is held behind `machinactl
// approve` (Held, Brake naming the revision, its changes marked held);
// once the revision is approved the step is planned and its changes are
// no longer held. A deployed server whose read matches gets no step
// either way.
func TestPlanFirmwareDeployedNeedsApproval(t *testing.T) {
	inv := cloneInv(exampleInventory(t))
	inv.Profile("hypervisor").Firmware = goodFirmware()
	matching := idracRead()
	matching.BIOS.Attributes = matching.BIOS.Attributes.With("ProcVirtualization", "Enabled")
	matching.Storage[1].Volumes = []state.Volume{{ID: "Disk.Virtual.0:RAID.Integrated.1-1", Name: "os", RAIDType: "RAID1"}}
	matching.Components[0].Version = "1.13.2"
	matching.SecureBoot.Enable = true
	snap := steadyFleet(inv)
	if s := snap.Servers["r1-n01"]; s.Lifecycle != state.LifecycleDeployed || s.Allocation == nil || s.Allocation.Profile != "hypervisor" {
		t.Fatalf("fixture: r1-n01 is %s with %+v; want deployed with hypervisor", s.Lifecycle, s.Allocation)
	}
	for name, fw := range map[string]*state.Firmware{"r1-n01": idracRead(), "r1-n02": matching} {
		s := snap.Servers[name]
		s.Firmware = fw
		snap.Servers[name] = s
	}
	fwSteps := func(steps []Step) []string {
		var out []string
		for _, s := range steps {
			if s.Action == ActFirmware {
				out = append(out, s.Server)
			}
		}
		return out
	}
	held := Compute(inv, snap, Options{Now: planT0.Add(time.Minute)})
	if got := fwSteps(held.Steps); len(got) != 0 {
		t.Errorf("not approved: firmware steps %v planned on deployed servers", got)
	}
	if got := fwSteps(held.Held); !cmp.Equal(got, []string{"r1-n01"}) {
		t.Errorf("not approved: held firmware steps %v, want [r1-n01]", got)
	}
	if want := "machinactl approve " + DigestPrefix(inv.Digest); !strings.Contains(held.Brake, want) || !strings.Contains(held.Brake, "reset 1 deployed server") {
		t.Errorf("Brake %q; want it to name %q and the reset", held.Brake, want)
	}
	for _, c := range held.Firmware {
		if c.Server != "r1-n01" || !c.Held {
			t.Errorf("change %s; want only r1-n01's, held", c)
		}
	}
	ok := Compute(inv, snap, Options{Now: planT0.Add(time.Minute), Approved: true})
	if got := fwSteps(ok.Steps); !cmp.Equal(got, []string{"r1-n01"}) {
		t.Errorf("approved: firmware steps %v, want [r1-n01]", got)
	}
	if len(ok.Held) != 0 || ok.Brake != "" {
		t.Errorf("approved: held %v brake %q; want none", ok.Held, ok.Brake)
	}
	for _, c := range ok.Firmware {
		if c.Held {
			t.Errorf("approved: change %s still held", c)
		}
	}
}
