package reconciler

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/machina-metal/machina/bmc"
	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/reconciler/plan"
	"github.com/machina-metal/machina/state"
)

// fwDriver is a bmc.Driver with the four firmware capabilities, answering
// from fields; an error field makes that area's read fail.
type fwDriver struct {
	bmc.Driver // nil: the power and boot methods are not used here
	bios       *bmc.BIOS
	storage    []bmc.StorageController
	comps      []bmc.FirmwareComponent
	sb         *bmc.SecureBoot
	biosErr    error
	storageErr error
	// setBIOS counts SetBIOS calls; each is accepted (OnReset, reset
	// required) and changes nothing, as a BIOS that reverts a setting at
	// boot.
	setBIOS int
}

func (d *fwDriver) BIOS(context.Context) (*bmc.BIOS, error) { return d.bios, d.biosErr }
func (d *fwDriver) SetBIOS(context.Context, bmc.BIOSSettings, bmc.ApplyTime) (*bmc.ApplyResult, error) {
	d.setBIOS++
	return &bmc.ApplyResult{ApplyTime: bmc.ApplyOnReset, ResetRequired: true}, nil
}
func (d *fwDriver) Storage(context.Context) ([]bmc.StorageController, error) {
	return d.storage, d.storageErr
}
func (d *fwDriver) CreateVolume(context.Context, bmc.VolumeRequest) (*bmc.ApplyResult, error) {
	return nil, errors.New("not used")
}
func (d *fwDriver) DeleteVolume(context.Context, string, string) (*bmc.ApplyResult, error) {
	return nil, errors.New("not used")
}
func (d *fwDriver) FirmwareInventory(context.Context) ([]bmc.FirmwareComponent, error) {
	return d.comps, nil
}
func (d *fwDriver) UpdateFirmware(context.Context, bmc.FirmwareUpdate) (*bmc.Task, error) {
	return nil, errors.New("not used")
}
func (d *fwDriver) Task(context.Context, string) (*bmc.Task, error) {
	return nil, errors.New("not used")
}
func (d *fwDriver) SecureBoot(context.Context) (*bmc.SecureBoot, error) { return d.sb, nil }
func (d *fwDriver) SetSecureBoot(context.Context, bool) (*bmc.ApplyResult, error) {
	return nil, errors.New("not used")
}

// plainDriver has none of the firmware capabilities (as the IPMI driver).
type plainDriver struct{ bmc.Driver }

func p64(n int64) *int64 { return &n }

// TestReadFirmware: the BMC's firmware read becomes the store's compact
// record (registry sorted by name with bounds by type, storage, inventory,
// Secure Boot); a driver without a capability, or a BMC answering
// ErrUnsupported, marks the area unsupported; any other error fails the
// whole read so no half read is stored.
func TestReadFirmware(t *testing.T) {
	at := time.Date(2026, 12, 6, 3, 0, 0, 0, time.UTC)
	d := &fwDriver{
		bios: &bmc.BIOS{Attributes: bmc.BIOSSettings{"ProcVirtualization": "Disabled", "AcPwrRcvryUserDelay": int64(120)},
			Pending:             bmc.BIOSSettings{"ProcVirtualization": "Enabled"},
			SupportedApplyTimes: []bmc.ApplyTime{bmc.ApplyImmediate, bmc.ApplyOnReset},
			Registry: &bmc.BIOSRegistry{ID: "BiosAttributeRegistry.v1_0_3", Attributes: []bmc.BIOSAttribute{
				{Name: "ProcVirtualization", Type: bmc.AttrEnumeration, AllowedValues: []string{"Enabled", "Disabled"}, ResetRequired: true},
				{Name: "AssetTag", Type: bmc.AttrString, MaxLength: p64(10)},
				{Name: "AcPwrRcvryUserDelay", Type: bmc.AttrInteger, LowerBound: p64(60), UpperBound: p64(240)},
			}}},
		storage: []bmc.StorageController{{ID: "RAID.Integrated.1-1", CanCreateVolumes: true, RAIDTypes: []string{"RAID1"},
			Drives:  []bmc.Drive{{ID: "Disk.Bay.0", CapacityBytes: 1 << 40, MediaType: "SSD", Model: "x"}},
			Volumes: []bmc.Volume{{ID: "Disk.Virtual.0", Name: "os", RAIDType: "RAID1", Drives: []string{"Disk.Bay.0"}}}}},
		comps: []bmc.FirmwareComponent{{ID: "BIOS", Name: "BIOS", Version: "1.10.2", Updateable: true}},
		sb:    &bmc.SecureBoot{Enable: true, CurrentBoot: "Enabled"},
	}
	got, err := ReadFirmware(t.Context(), d, at)
	if err != nil {
		t.Fatal(err)
	}
	want := &state.Firmware{ReadAt: at,
		BIOS: &state.FirmwareBIOS{Attributes: state.NewBIOSValues(map[string]any{"ProcVirtualization": "Disabled", "AcPwrRcvryUserDelay": int64(120)}),
			Pending: map[string]any{"ProcVirtualization": "Enabled"}, RegistryID: "BiosAttributeRegistry.v1_0_3",
			Registry: []state.BIOSAttribute{
				{Name: "AcPwrRcvryUserDelay", Type: "Integer", Min: p64(60), Max: p64(240)},
				{Name: "AssetTag", Type: "String", Max: p64(10)},
				{Name: "ProcVirtualization", Type: "Enumeration", Values: []string{"Enabled", "Disabled"}, ResetRequired: true},
			},
			ApplyTimes: []string{"Immediate", "OnReset"}},
		Storage: []state.StorageController{{ID: "RAID.Integrated.1-1", CanCreateVolumes: true, RAIDTypes: []string{"RAID1"},
			Drives:  []state.StorageDrive{{ID: "Disk.Bay.0", CapacityBytes: 1 << 40, MediaType: "SSD"}},
			Volumes: []state.Volume{{ID: "Disk.Virtual.0", Name: "os", RAIDType: "RAID1", Drives: []string{"Disk.Bay.0"}}}}},
		Components: []state.FirmwareComponent{{ID: "BIOS", Name: "BIOS", Version: "1.10.2", Updateable: true}},
		SecureBoot: &state.SecureBootState{Enable: true, CurrentBoot: "Enabled"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("ReadFirmware (-want +got):\n%s", diff)
	}

	d.storageErr = fmt.Errorf("redfish: get Storage: %w", bmc.ErrUnsupported)
	got, err = ReadFirmware(t.Context(), d, at)
	if err != nil || got.Storage != nil || got.Unsupported[state.FirmwareAreaRAID] == "" || len(got.Unsupported) != 1 {
		t.Errorf("no Storage resource: %+v, %v; want raid unsupported, the rest read", got, err)
	}
	d.biosErr = fmt.Errorf("redfish: get Bios: %w", bmc.ErrTimeout)
	if got, err := ReadFirmware(t.Context(), d, at); err == nil || got != nil || !errors.Is(err, bmc.ErrTimeout) {
		t.Errorf("bios read timed out: %+v, %v; want the error and no record", got, err)
	}
	got, err = ReadFirmware(t.Context(), plainDriver{}, at)
	if err != nil || len(got.Unsupported) != 4 || got.BIOS != nil {
		t.Errorf("driver without firmware capabilities: %+v, %v; want all four areas unsupported", got, err)
	}
}

// TestFirmwareStepMismatchStalls: the firmware step writes the setting,
// resets, reads back; a BIOS that still reports the old value fails the
// step naming both values, and the server stalls: the next passes plan
// the step but never send the setting again.
func TestFirmwareStepMismatchStalls(t *testing.T) {
	inv := &inventory.Inventory{
		Servers: []inventory.Server{{Name: "s1", Zone: "z", BootMAC: "52:54:00:00:00:01", BootMode: inventory.BootUEFI, Want: inventory.WantDeployed, Profile: "p",
			BMC: inventory.BMC{Driver: inventory.DriverRedfish, Address: "https://bmc.invalid", Credentials: "c"}}},
		Profiles: []inventory.Profile{{Name: "p", Image: "img", Deploy: inventory.DeployImage,
			Firmware: &inventory.Firmware{Settings: map[string]any{"ProcVirtualization": "Enabled"}}}},
		Images: []inventory.Image{{Name: "img", URL: "http://x/img.raw", Checksum: "sha256:" + strings.Repeat("0", 64)}},
		Digest: "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
	}
	st := pinnedAllocated(t, inv)
	fw := &fwDriver{bios: &bmc.BIOS{Attributes: bmc.BIOSSettings{"ProcVirtualization": "Disabled", "SriovGlobalEnable": "Disabled"},
		Registry: &bmc.BIOSRegistry{Attributes: []bmc.BIOSAttribute{{Name: "ProcVirtualization", Type: bmc.AttrEnumeration, AllowedValues: []string{"Enabled", "Disabled"}},
			{Name: "SriovGlobalEnable", Type: bmc.AttrEnumeration, AllowedValues: []string{"Enabled", "Disabled"}}}}}}
	drv := struct {
		*recordingDriver
		*fwDriver
	}{&recordingDriver{on: true}, fw}
	c, err := New(Config{Store: st, Drivers: oneDriver{drv}, BackoffBase: time.Nanosecond}) // the stall, not the backoff, holds the retry
	if err != nil {
		t.Fatal(err)
	}
	c.SetDesired(inv)
	for i := 0; i < 3; i++ {
		res := c.Pass(context.Background())
		c.wg.Wait()
		if i == 0 && (len(res.Steps) != 1 || res.Steps[0].Action != plan.ActFirmware) {
			t.Fatalf("plan %v, want the firmware step", res.Steps)
		}
	}
	srv, err := st.Server("s1")
	if err != nil {
		t.Fatal(err)
	}
	if want := "bios-set ProcVirtualization read back Disabled, wanted Enabled"; !strings.Contains(srv.LastError, want) || srv.Stalled == "" {
		t.Errorf("LastError %q stalled %q; want the mismatch (%s) and a stall", srv.LastError, srv.Stalled, want)
	}
	if fw.setBIOS != 1 {
		t.Errorf("SetBIOS called %d times over three passes; want once (stalled, not retried)", fw.setBIOS)
	}
	if srv.Lifecycle != state.LifecycleAllocated {
		t.Errorf("lifecycle %s; want allocated (never deployed)", srv.Lifecycle)
	}

	// The profile changes (a new revision): the server is not deployed,
	// so the step runs again at once, no approval needed, and stalls
	// again on its own read-back.
	inv2 := *inv
	inv2.Profiles = []inventory.Profile{inv.Profiles[0]}
	inv2.Profiles[0].Firmware = &inventory.Firmware{Settings: map[string]any{"ProcVirtualization": "Enabled", "SriovGlobalEnable": "Enabled"}}
	inv2.Digest = "sha256:1123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	c.SetDesired(&inv2)
	for i := 0; i < 3; i++ {
		c.Pass(context.Background())
		c.wg.Wait()
	}
	if fw.setBIOS != 2 {
		t.Errorf("SetBIOS called %d times in all; want twice (once more after the profile changed, then stalled again)", fw.setBIOS)
	}
	if srv, err = st.Server("s1"); err != nil || !strings.Contains(srv.LastError, "SriovGlobalEnable read back Disabled, wanted Enabled") || srv.Stalled == "" {
		t.Errorf("after the profile change: LastError %q stalled %q (%v); want the new mismatch and a stall", srv.LastError, srv.Stalled, err)
	}
}

// pinnedAllocated opens a state store in the test's folder (closed at the
// test's end) holding inv.Servers[0] walked new → commissioning → ready →
// allocated, with its allocation to its own profile pinned: the server a
// firmware step starts from.
func pinnedAllocated(t *testing.T, inv *inventory.Inventory) *state.Store {
	t.Helper()
	st, err := state.Open(filepath.Join(t.TempDir(), "state.db"), state.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	ws := inv.Servers[0]
	if _, err := st.CreateServer(plan.Record(&ws)); err != nil {
		t.Fatal(err)
	}
	for _, m := range [][2]state.Lifecycle{{state.LifecycleNew, state.LifecycleCommissioning}, {state.LifecycleCommissioning, state.LifecycleReady}, {state.LifecycleReady, state.LifecycleAllocated}} {
		if _, err := st.Transition(ws.Name, m[0], m[1], "test"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := st.UpdateServer(ws.Name, func(s *state.Server) error {
		s.Allocation = &state.Allocation{Profile: ws.Profile, Reason: plan.ReasonPinned, At: time.Now()}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return st
}
