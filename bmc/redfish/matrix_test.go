package redfish_test

import (
	"context"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/machina-metal/machina/bmc"
	"github.com/machina-metal/machina/bmc/bmcsim"
)

// vendor is what each fixture tree makes the driver send. Every value here
// is read off the tree (see fixtures/redfish/README.md, "Quirks by folder").
type vendor struct {
	tree string
	sys  string // ComputerSystem path
	// allowed is the tree's ResetType list (inline or ActionInfo).
	allowed []string
	// cycle is the ResetType used for a cycle of a running machine.
	cycle string
	// bootPath is where boot PATCHes go (the settings object if any).
	bootPath string
	// ifMatch: boot PATCHes carry If-Match (vendor quirk).
	ifMatch bool
	// modeAlways: boot PATCHes carry the current mode (vendor quirk).
	modeAlways bool
	// legacyUnsupported: a change to Legacy mode is refused up front.
	legacyUnsupported bool
	// continuousUnsupported: BootSourceOverrideEnabled lacks Continuous.
	continuousUnsupported bool
	// noResetEvidence: the tree has neither LastResetTime nor
	// BootProgress, so a reset of a running machine is unverified.
	noResetEvidence bool
	// insert and eject are the writes for media insert (on an empty or
	// fixture-state slot) and eject; nil insert means no virtual CD.
	insert []string
	eject  []string
}

const isoURL = "http://10.0.0.1/boot/machina.iso"

var vendors = []vendor{
	{
		tree: treeDMTF, sys: "/redfish/v1/Systems/437XR1138R2",
		allowed: []string{"On", "ForceOff", "GracefulShutdown", "GracefulRestart", "ForceRestart", "Nmi", "ForceOn", "PushPowerButton"},
		cycle:   "ForceRestart", bootPath: "/redfish/v1/Systems/437XR1138R2",
		// CD1 holds an Applet-connected image in the fixture: ejected first,
		// by PATCH, as the slot has no actions.
		insert: []string{
			`PATCH /redfish/v1/Systems/437XR1138R2/VirtualMedia/CD1 {"Image":null,"Inserted":false}`,
			`PATCH /redfish/v1/Systems/437XR1138R2/VirtualMedia/CD1 {"Image":"` + isoURL + `","Inserted":true}`,
		},
		eject: []string{`PATCH /redfish/v1/Systems/437XR1138R2/VirtualMedia/CD1 {"Image":null,"Inserted":false}`},
	},
	{
		tree: treeDell, sys: "/redfish/v1/Systems/System.Embedded.1",
		allowed: []string{"On", "ForceOff", "ForceRestart", "GracefulRestart", "GracefulShutdown", "PushPowerButton", "Nmi", "PowerCycle"},
		cycle:   "PowerCycle", bootPath: "/redfish/v1/Systems/System.Embedded.1",
		insert: []string{`POST /redfish/v1/Systems/System.Embedded.1/VirtualMedia/1/Actions/VirtualMedia.InsertMedia {"Image":"` + isoURL + `"}`},
		eject:  []string{`POST /redfish/v1/Systems/System.Embedded.1/VirtualMedia/1/Actions/VirtualMedia.EjectMedia {}`},
	},
	{
		tree: treeHPE, sys: "/redfish/v1/Systems/1",
		allowed: []string{"On", "ForceOff", "GracefulShutdown", "ForceRestart", "Nmi", "PushPowerButton", "GracefulRestart"},
		cycle:   "ForceRestart", bootPath: "/redfish/v1/Systems/1", legacyUnsupported: true, noResetEvidence: true,
		insert: []string{`POST /redfish/v1/Managers/1/VirtualMedia/2/Actions/VirtualMedia.InsertMedia {"Image":"` + isoURL + `"}`},
		eject:  []string{`POST /redfish/v1/Managers/1/VirtualMedia/2/Actions/VirtualMedia.EjectMedia {}`},
	},
	{
		tree: treeLenovo, sys: "/redfish/v1/Systems/1",
		allowed: []string{"On", "Nmi", "GracefulShutdown", "GracefulRestart", "ForceOn", "ForceOff", "ForceRestart"},
		cycle:   "ForceRestart", bootPath: "/redfish/v1/Systems/1/Pending", ifMatch: true, continuousUnsupported: true, noResetEvidence: true,
		insert: []string{`PATCH /redfish/v1/Systems/1/VirtualMedia/EXT1 {"Image":"` + isoURL + `","Inserted":true} If-Match`},
		eject:  []string{`PATCH /redfish/v1/Systems/1/VirtualMedia/EXT1 {"Image":null,"Inserted":false} If-Match`},
	},
	{
		tree: treeSupermicro, sys: "/redfish/v1/Systems/1",
		allowed: []string{"On", "ForceOff", "GracefulShutdown", "GracefulRestart", "ForceRestart", "Nmi", "ForceOn", "PowerCycle"},
		cycle:   "PowerCycle", bootPath: "/redfish/v1/Systems/1", modeAlways: true,
		insert: []string{`POST /redfish/v1/Managers/1/VirtualMedia/VirtualMedia1/Actions/VirtualMedia.InsertMedia {"Image":"` + isoURL + `"}`},
		// No EjectMedia action in this capture: PATCH.
		eject: []string{`PATCH /redfish/v1/Managers/1/VirtualMedia/VirtualMedia1 {"Image":null,"Inserted":false}`},
	},
	{
		tree: treeOpenBMC, sys: "/redfish/v1/Systems/system",
		allowed: []string{"On", "ForceOff", "ForceOn", "ForceRestart", "GracefulRestart", "GracefulShutdown", "PowerCycle", "Nmi"},
		cycle:   "PowerCycle", bootPath: "/redfish/v1/Systems/system",
	},
}

// unverified is the error a reset of a running machine gives on a tree
// without reset evidence.
func unverified(v vendor) error {
	if v.noResetEvidence {
		return bmc.ErrUnverified
	}
	return nil
}

func reset(v vendor, rt string) string {
	return "POST " + v.sys + `/Actions/ComputerSystem.Reset {"ResetType":"` + rt + `"}`
}

func bootPatch(v vendor, body string) string {
	s := "PATCH " + v.bootPath + " " + body
	if v.ifMatch {
		s += " If-Match"
	}
	return s
}

// TestVendorMatrix runs every driver operation against every fixture tree
// served by bmcsim and asserts the exact writes the emulator saw, the state
// it ended in, and that no ResetType outside the tree's list was sent.
func TestVendorMatrix(t *testing.T) {
	type op struct {
		name    string
		on      bool // initial power
		run     func(ctx context.Context, l *lab) error
		want    func(v vendor) []string
		wantErr func(v vendor) error
		wantOn  *bool
		check   func(t *testing.T, v vendor, l *lab)
	}
	yes, no := true, false
	ops := []op{
		{name: "power-on-from-off", on: false, run: power(bmc.PowerActionOn), wantOn: &yes,
			want: func(v vendor) []string { return []string{reset(v, "On")} }},
		{name: "power-on-when-on", on: true, run: power(bmc.PowerActionOn), wantOn: &yes,
			want: func(vendor) []string { return nil }},
		{name: "power-off-from-on", on: true, run: power(bmc.PowerActionOff), wantOn: &no,
			want: func(v vendor) []string { return []string{reset(v, "ForceOff")} }},
		{name: "power-off-when-off", on: false, run: power(bmc.PowerActionOff), wantOn: &no,
			want: func(vendor) []string { return nil }},
		{name: "soft-off", on: true, run: power(bmc.PowerActionSoftOff), wantOn: &no,
			want: func(v vendor) []string { return []string{reset(v, "GracefulShutdown")} }},
		{name: "reset-running", on: true, run: power(bmc.PowerActionReset), wantOn: &yes, wantErr: unverified,
			want: func(v vendor) []string { return []string{reset(v, "ForceRestart")} }},
		{name: "reset-stopped-powers-on", on: false, run: power(bmc.PowerActionReset), wantOn: &yes,
			want: func(v vendor) []string { return []string{reset(v, "On")} }},
		{name: "cycle-running", on: true, run: power(bmc.PowerActionCycle), wantOn: &yes, wantErr: unverified,
			want: func(v vendor) []string { return []string{reset(v, v.cycle)} }},
		{name: "cycle-stopped-powers-on", on: false, run: power(bmc.PowerActionCycle), wantOn: &yes,
			want: func(v vendor) []string { return []string{reset(v, "On")} }},
		{name: "boot-pxe-once", on: true,
			run: boot(bmc.BootOverride{Device: bmc.BootPXE}),
			want: func(v vendor) []string {
				if v.modeAlways {
					return []string{bootPatch(v, `{"Boot":{"BootSourceOverrideEnabled":"Once","BootSourceOverrideMode":"UEFI","BootSourceOverrideTarget":"Pxe"}}`)}
				}
				return []string{bootPatch(v, `{"Boot":{"BootSourceOverrideEnabled":"Once","BootSourceOverrideTarget":"Pxe"}}`)}
			},
			check: func(t *testing.T, v vendor, l *lab) {
				got, err := l.drv.BootOverride(context.Background())
				if err != nil || got != (bmc.BootOverride{Device: bmc.BootPXE, Mode: bmc.BootModeUEFI}) {
					t.Errorf("BootOverride() = %+v, %v; want pxe once uefi", got, err)
				}
			}},
		{name: "boot-disk-persistent-uefi", on: true,
			run: boot(bmc.BootOverride{Device: bmc.BootDisk, Persistent: true, Mode: bmc.BootModeUEFI}),
			want: func(v vendor) []string {
				if v.continuousUnsupported {
					return nil
				}
				if v.modeAlways {
					return []string{bootPatch(v, `{"Boot":{"BootSourceOverrideEnabled":"Continuous","BootSourceOverrideMode":"UEFI","BootSourceOverrideTarget":"Hdd"}}`)}
				}
				return []string{bootPatch(v, `{"Boot":{"BootSourceOverrideEnabled":"Continuous","BootSourceOverrideTarget":"Hdd"}}`)}
			},
			wantErr: func(v vendor) error {
				if v.continuousUnsupported {
					return bmc.ErrUnsupported
				}
				return nil
			}},
		{name: "boot-cd-legacy", on: true,
			run: boot(bmc.BootOverride{Device: bmc.BootCD, Mode: bmc.BootModeLegacy}),
			want: func(v vendor) []string {
				if v.legacyUnsupported {
					return nil
				}
				return []string{bootPatch(v, `{"Boot":{"BootSourceOverrideEnabled":"Once","BootSourceOverrideMode":"Legacy","BootSourceOverrideTarget":"Cd"}}`)}
			},
			wantErr: func(v vendor) error {
				if v.legacyUnsupported {
					return bmc.ErrUnsupported
				}
				return nil
			}},
		{name: "media-insert", on: true,
			run:  func(ctx context.Context, l *lab) error { return l.drv.InsertMedia(ctx, isoURL) },
			want: func(v vendor) []string { return v.insert },
			wantErr: func(v vendor) error {
				if v.insert == nil {
					return bmc.ErrUnsupported
				}
				return nil
			}},
		{name: "media-eject", on: true,
			run: func(ctx context.Context, l *lab) error {
				if err := l.drv.InsertMedia(ctx, isoURL); err != nil {
					return err
				}
				l.sim.ClearRequests()
				if err := l.drv.EjectMedia(ctx); err != nil {
					return err
				}
				// A second eject finds the slot empty and sends nothing.
				return l.drv.EjectMedia(ctx)
			},
			want: func(v vendor) []string { return v.eject },
			wantErr: func(v vendor) error {
				if v.insert == nil {
					return bmc.ErrUnsupported
				}
				return nil
			}},
	}
	for _, v := range vendors {
		for _, o := range ops {
			t.Run(v.tree+"/"+o.name, func(t *testing.T) {
				l := newLab(t, v.tree, labOpts{on: o.on})
				ctx := context.Background()
				err := o.run(ctx, l)
				var wantErr error
				if o.wantErr != nil {
					wantErr = o.wantErr(v)
				}
				if wantErr == nil && err != nil {
					t.Fatalf("%s: %v", o.name, err)
				}
				if wantErr != nil && !errors.Is(err, wantErr) {
					t.Fatalf("%s: err = %v, want %v", o.name, err, wantErr)
				}
				if diff := cmp.Diff(o.want(v), l.writes()); diff != "" {
					t.Errorf("writes (-want +got):\n%s", diff)
				}
				// The full exchange, reads included, against a reviewed
				// golden file (refresh with -update).
				golden(t, filepath.Join("testdata", "golden", v.tree, o.name+".txt"), l.transcript())
				assertResetTypesAllowed(t, v, l.sim)
				if o.wantOn != nil && l.power.On() != *o.wantOn {
					t.Errorf("power on = %v, want %v", l.power.On(), *o.wantOn)
				}
				if o.check != nil {
					o.check(t, v, l)
				}
				if err := l.drv.Close(ctx); err != nil {
					t.Fatal(err)
				}
				if n := l.sim.Sessions(); n != 0 {
					t.Errorf("sessions left after Close: %d", n)
				}
			})
		}
	}
}

func power(a bmc.PowerAction) func(context.Context, *lab) error {
	return func(ctx context.Context, l *lab) error { return l.drv.Power(ctx, a) }
}

func boot(o bmc.BootOverride) func(context.Context, *lab) error {
	return func(ctx context.Context, l *lab) error { return l.drv.SetBootOverride(ctx, o) }
}

// assertResetTypesAllowed fails if any Reset the emulator received carried
// a ResetType outside the tree's AllowableValues.
func assertResetTypesAllowed(t *testing.T, v vendor, sim *bmcsim.Server) {
	t.Helper()
	for _, r := range sim.Requests() {
		if rt, ok := r.Body["ResetType"].(string); ok && !slices.Contains(v.allowed, rt) {
			t.Errorf("sent ResetType %q, tree allows %v", rt, v.allowed)
		}
	}
}

var update = flag.Bool("update", false, "rewrite golden files")

// golden compares got with the file at path, or rewrites it with -update.
func golden(t *testing.T, path, got string) {
	t.Helper()
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update and review)", err)
	}
	if diff := cmp.Diff(strings.Split(string(want), "\n"), strings.Split(got, "\n")); diff != "" {
		t.Errorf("requests differ from %s (-want +got):\n%s", path, diff)
	}
}

// transcript renders every request the emulator saw, one per line:
// "METHOD path status auth [If-Match] [body]".
func (l *lab) transcript() string {
	var b strings.Builder
	for _, r := range l.sim.Requests() {
		line := r.Method + " " + r.Path + " " + itoa(r.Status) + authOf(r.Auth) + ifMatchOf(r.IfMatch)
		if r.Body != nil {
			line += strings.TrimPrefix(r.String(), r.Method+" "+r.Path) // " {json}"
		}
		b.WriteString(line + "\n")
	}
	return b.String()
}

func authOf(a string) string {
	if a == "" {
		return ""
	}
	return " " + a
}

func ifMatchOf(s string) string {
	if s == "" {
		return ""
	}
	return " If-Match"
}
