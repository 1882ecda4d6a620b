package inventory

import (
	"errors"
	"strconv"
	"strings"
	"testing"
)

// TestProfileErase: a profile's erase is one of metadata, discard, zero
// and secure (absent means metadata, the release wipe of partition
// tables and signatures); anything else is refused naming the file, line
// and field.
func TestProfileErase(t *testing.T) {
	for _, tc := range []struct {
		name, profile string
		want          EraseMethod
		wantErr       string
	}{
		{"absent", "", "", ""},
		{"metadata", "    erase: metadata\n", EraseMetadata, ""},
		{"discard", "    erase: discard\n", EraseDiscard, ""},
		{"zero", "    erase: zero\n", EraseZero, ""},
		{"secure", "    erase: secure\n", EraseSecure, ""},
		{"unknown", "    erase: shred\n", "", "profiles.yaml:5:12: profiles[0].erase"},
		{"case", "    erase: Secure\n", "", "profiles[0].erase"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := loadWithProfile(t, labelServers, tc.profile)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("Load = %v, want valid", err)
				}
				if got := res.Inventory.Profile("p").Erase; got != tc.want {
					t.Fatalf("erase = %q, want %q", got, tc.want)
				}
				return
			}
			var verr *ValidationError
			if !errors.As(err, &verr) {
				t.Fatalf("Load = %v, want a validation error", err)
			}
			for _, fe := range verr.Errors {
				if strings.Contains(fe.Error(), tc.wantErr) {
					return
				}
			}
			t.Fatalf("Load = %v, want an error containing %q", verr.Errors, tc.wantErr)
		})
	}
}

// TestProfileEraseOverrides: eraseOverrides pick disks with the storage
// layout's selector and give them a method; a bad method, an empty
// selector, an unknown selector field, secure for virtio disks and an
// override that repeats an earlier selector are refused naming the file,
// line and field.
func TestProfileEraseOverrides(t *testing.T) {
	for _, tc := range []struct {
		name, profile string
		wantErr       string
	}{
		{"nvme secure", "    erase: zero\n    eraseOverrides:\n      - {disks: {transport: nvme}, method: secure}\n      - {disks: {rotational: true, model: \"ST*\"}, method: discard}\n", ""},
		{"unknown method", "    erase: zero\n    eraseOverrides:\n      - disks: {transport: nvme}\n        method: crypto\n", "profiles.yaml:8:17: profiles[0].eraseOverrides[0].method"},
		{"empty selector", "    eraseOverrides:\n      - {disks: {}, method: secure}\n", "profiles[0].eraseOverrides[0].disks"},
		{"kernel name", "    eraseOverrides:\n      - {disks: {name: nvme0n1}, method: secure}\n", "profiles[0].eraseOverrides[0].disks"},
		{"no method", "    eraseOverrides:\n      - {disks: {transport: nvme}}\n", "profiles[0].eraseOverrides[0]"},
		{"secure virtio", "    eraseOverrides:\n      - disks: {transport: virtio}\n        method: secure\n", "profiles.yaml:7:17: profiles[0].eraseOverrides[0].method: method secure selects transport virtio disks"},
		{"shadowed", "    eraseOverrides:\n      - {disks: {transport: nvme}, method: secure}\n      - {disks: {transport: nvme}, method: zero}\n", "profiles[0].eraseOverrides[1].disks: the same disks as the earlier override at profiles.yaml:6:"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := loadWithProfile(t, labelServers, tc.profile)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("Load = %v, want valid", err)
				}
				p := res.Inventory.Profile("p")
				if len(p.EraseOverrides) != 2 || p.EraseOverrides[0].Method != EraseSecure || p.EraseOverrides[0].Disks.Transport != "nvme" || p.EraseOverrides[1].Disks.Model != "ST*" {
					t.Fatalf("eraseOverrides = %+v", p.EraseOverrides)
				}
				return
			}
			var verr *ValidationError
			if !errors.As(err, &verr) {
				t.Fatalf("Load = %v, want a validation error", err)
			}
			for _, fe := range verr.Errors {
				if strings.Contains(fe.Error(), tc.wantErr) {
					return
				}
			}
			t.Fatalf("Load = %v, want an error containing %q", verr.Errors, tc.wantErr)
		})
	}
}

// TestPlanErase: each disk takes the method of the first override that
// matches it (transport, rotational, model pattern, WWN, by-path, least
// size), else the profile's default; an override matching no disk does
// nothing.
func TestPlanErase(t *testing.T) {
	yes, no := true, false
	disks := []StorageDisk{
		{Name: "nvme0n1", SizeBytes: 960 << 30, Model: "SAMSUNG MZQL2960", WWN: "eui.0025388b11b2a0c1", ByPath: "pci-0000:41:00.0-nvme-1", Transport: "nvme"},
		{Name: "nvme1n1", SizeBytes: 3840 << 30, Model: "SAMSUNG MZQL23T8", WWN: "eui.0025388b11b2a0c2", ByPath: "pci-0000:42:00.0-nvme-1", Transport: "nvme"},
		{Name: "sda", SizeBytes: 8000 << 30, Model: "ST8000NM000A", WWN: "0x5000c500a1b2c3d4", ByPath: "pci-0000:00:17.0-ata-1", Transport: "sata", Rotational: true},
		{Name: "sdb", SizeBytes: 480 << 30, Model: "INTEL SSDSC2KB48", Serial: "BTYF1234", ByPath: "pci-0000:00:17.0-ata-2", Transport: "sata", Rotational: false},
	}
	for _, tc := range []struct {
		name      string
		def       EraseMethod
		overrides []EraseOverride
		want      string
	}{
		{"default only", EraseZero, nil, "nvme0n1 zero -1, nvme1n1 zero -1, sda zero -1, sdb zero -1"},
		{"nvme secure", EraseZero, []EraseOverride{{Disks: DiskMatch{Transport: "nvme"}, Method: EraseSecure}}, "nvme0n1 secure 0, nvme1n1 secure 0, sda zero -1, sdb zero -1"},
		{"first match wins", EraseMetadata, []EraseOverride{
			{Disks: DiskMatch{WWN: []string{"0025388B11B2A0C2"}}, Method: EraseZero},
			{Disks: DiskMatch{Rotational: &no}, Method: EraseSecure},
			{Disks: DiskMatch{Rotational: &yes}, Method: EraseDiscard},
		}, "nvme0n1 secure 1, nvme1n1 zero 0, sda discard 2, sdb secure 1"},
		{"model and by-path", "", []EraseOverride{
			{Disks: DiskMatch{Model: "INTEL SSDSC*"}, Method: EraseSecure},
			{Disks: DiskMatch{ByPath: []string{"/dev/disk/by-path/pci-0000:41:00.0-nvme-1"}}, Method: EraseZero},
		}, "nvme0n1 zero 1, nvme1n1  -1, sda  -1, sdb secure 0"},
		{"least size", EraseZero, []EraseOverride{{Disks: DiskMatch{MinSizeGiB: 1000, Transport: "nvme"}, Method: EraseSecure}}, "nvme0n1 zero -1, nvme1n1 secure 0, sda zero -1, sdb zero -1"},
		{"matches nothing", EraseZero, []EraseOverride{{Disks: DiskMatch{Transport: "sas"}, Method: EraseSecure}}, "nvme0n1 zero -1, nvme1n1 zero -1, sda zero -1, sdb zero -1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, e := range PlanErase(tc.def, tc.overrides, disks) {
				got = append(got, e.Disk.Name+" "+string(e.Method)+" "+strconv.Itoa(e.Override))
			}
			if g := strings.Join(got, ", "); g != tc.want {
				t.Errorf("PlanErase = %q, want %q", g, tc.want)
			}
		})
	}
}
