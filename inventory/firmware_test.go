package inventory

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestLoadFirmware: a profile's firmware block loads into the types the
// plan reads: settings keep their YAML type (string, number, bool), RAID
// sizes convert to bytes, versions name a firmware catalog entry of images.yaml (URL, sha256 checksum, size), and
// secureBoot is a set pointer.
func TestLoadFirmware(t *testing.T) {
	res, err := loadDir(t, "testdata/valid/firmware")
	if err != nil {
		t.Fatal(err)
	}
	fw := res.Inventory.Profile("hypervisor").Firmware
	if fw == nil {
		t.Fatal("profile hypervisor has no firmware block")
	}
	wantSettings := map[string]any{"ProcVirtualization": "Enabled", "BootMode": "Uefi", "NumLock": false, "ProcCoreDisable": float64(0)}
	if d := cmp.Diff(wantSettings, fw.Settings); d != "" {
		t.Errorf("settings (-want +got):\n%s", d)
	}
	if len(fw.RAID) != 2 || fw.RAID[0].SizeBytes() != 0 || fw.RAID[1].SizeBytes() != 2<<40 {
		t.Errorf("raid = %+v; want os (all, 0 bytes) and data (2TiB)", fw.RAID)
	}
	if fw.RAID[0].Drives != (DriveSelector{Count: 2, MediaType: "SSD", MinSizeGiB: 200}) {
		t.Errorf("raid[0].drives = %+v", fw.RAID[0].Drives)
	}
	if len(fw.Versions) != 2 || fw.Versions[0].Image != "bios-2-19" || fw.Versions[1].Image != "idrac-7-10" {
		t.Errorf("versions = %+v", fw.Versions)
	}
	fi := res.Inventory.FirmwareImage("idrac-7-10")
	if fi == nil || fi.SizeBytes != 201326592 || fi.Checksum != "sha256:"+strings.Repeat("2", 64) || !strings.HasSuffix(fi.URL, "_A00.EXE") {
		t.Errorf("firmware catalog entry idrac-7-10 = %+v", fi)
	}
	if fw.SecureBoot == nil || !*fw.SecureBoot {
		t.Errorf("secureBoot = %v; want true", fw.SecureBoot)
	}
	for _, v := range []struct {
		size string
		want int64
	}{{"all", 0}, {"500GiB", 500 << 30}, {"1TiB", 1 << 40}, {"12", 0}} {
		if got := (RAIDVolume{Size: v.size}).SizeBytes(); got != v.want {
			t.Errorf("SizeBytes(%q) = %d, want %d", v.size, got, v.want)
		}
	}
}
