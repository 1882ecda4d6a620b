package deployplan

import (
	"context"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/images"
	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/state"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden")

// fixedJoin returns a join command naming the server, as joinCommander
// does with a fresh enrolment token.
type fixedJoin struct{}

func (fixedJoin) JoinCommand(_ context.Context, srv state.Server, p inventory.Profile) (string, string, error) {
	return "curl -fsS https://10.99.0.1:8443/install.sh | MACHINA_JOIN_TOKEN=\"$(cat /var/lib/machina/join-token)\" sh", "enrol-" + srv.Name + "-" + p.Name + "-token", nil
}

// TestInstallerDocumentGolden: the documents the controller serves for the
// example site's kickstart profile (gpu) and an autoinstall variant of it:
// hostname, the profile's SSH keys, its minimum disk size, the real
// first-boot join command and the completion callback at the controller's
// public URL with the given single-use token.
func TestInstallerDocumentGolden(t *testing.T) {
	res, err := inventory.Load(os.DirFS("../../inventory-example"), inventory.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	inv := res.Inventory
	p := &Planner{Desired: func() *inventory.Inventory { return inv }, BaseURL: "http://10.99.0.1:8080/", Join: fixedJoin{}}
	for _, kind := range []inventory.DeployMethod{inventory.DeployKickstart, inventory.DeployAutoinstall} {
		for i := range inv.Profiles {
			if inv.Profiles[i].Name == "gpu" {
				inv.Profiles[i].Deploy = kind
			}
		}
		srv := state.Server{Name: "r3-n01", Lifecycle: state.LifecycleDeploying,
			Allocation: &state.Allocation{Profile: "gpu", Image: "rocky-9", Deploy: string(kind), At: time.Unix(1700000000, 0)}}
		doc, err := p.InstallerDocument(context.Background(), srv, "cbTOKEN123")
		if err != nil {
			t.Fatal(err)
		}
		for _, must := range []string{"http://10.99.0.1:8080/install/done/cbTOKEN123", "enrol-r3-n01-gpu-token", "r3-n01",
			"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIO4VqFGm2ahY3KSc9k9lrQMD0j2/tR46oEgCPUxiE9s7 ops@lab1", "429496729600"} {
			if !strings.Contains(string(doc), must) {
				t.Errorf("%s document lacks %q", kind, must)
			}
		}
		path := filepath.Join("testdata", "installer-"+string(kind)+".golden")
		if *update {
			if err := os.WriteFile(path, doc, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		want, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("%v (run go test -update)", err)
		}
		if d := cmp.Diff(string(want), string(doc)); d != "" {
			t.Errorf("%s differs (-want +got):\n%s", path, d)
		}
	}
	// An image profile has no installer document.
	srv := state.Server{Name: "r1-n01", Allocation: &state.Allocation{Profile: "hypervisor", Image: "ubuntu-24.04"}}
	if _, err := p.InstallerDocument(context.Background(), srv, "x"); err == nil {
		t.Error("InstallerDocument rendered an image profile")
	}
}

// TestDeployPlanDiskRule: an image deploy's plan carries the disk rule
// ("the ramdisk's deploy plan with the image, disk rule and seed
// from the profile"): without a rootDevice on the server, the smallest disk
// of at least the profile's min.diskGiB (the disk allocation counted when
// it found the server big enough), as the installer documents already
// had; a server's rootDevice hint wins.
func TestDeployPlanDiskRule(t *testing.T) {
	res, err := inventory.Load(os.DirFS("../../inventory-example"), inventory.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	inv := res.Inventory
	dir := t.TempDir()
	store, err := images.OpenStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	rec := images.Record{Name: "ubuntu-24.04", Source: "http://mirror.invalid/ubuntu.img", State: images.StateVerified, SizeBytes: 3 << 30,
		Raw: images.Digest{Algo: "sha256", Hex: strings.Repeat("ab", 32)}}
	b, err := json.Marshal(rec)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "images", "ubuntu-24.04.json"), b, 0o640); err != nil {
		t.Fatal(err)
	}
	p := &Planner{Desired: func() *inventory.Inventory { return inv }, Images: store, BaseURL: "http://10.99.0.1:8080", Join: fixedJoin{}}
	srv := state.Server{Name: "r1-n01", BootMAC: "52:54:00:01:00:01", Lifecycle: state.LifecycleDeploying,
		Allocation: &state.Allocation{Profile: "hypervisor", Image: "ubuntu-24.04", At: time.Unix(1700000000, 0)}}
	plan, err := p.DeployPlan(context.Background(), srv)
	if err != nil {
		t.Fatal(err)
	}
	if want := (v1.RootDeviceHint{MinSizeBytes: 100 << 30}); plan.RootDevice != want {
		t.Errorf("plan disk rule %+v, want %+v (hypervisor's min.diskGiB 100)", plan.RootDevice, want)
	}
	if plan.ImageSHA256 != rec.Raw.Hex || plan.Seed.Hostname != "r1-n01" || plan.Seed.JoinToken != "enrol-r1-n01-hypervisor-token" || !strings.Contains(plan.Seed.JoinCommand, "/var/lib/machina/join-token") {
		t.Errorf("plan %+v", plan)
	}
	// A storage layout is laid onto the commissioned disks and handed to
	// the agent by stable identity and size (a group on a RAID1 with its
	// raid and both members); one that no longer fits refuses the plan.
	ssd, hdd := false, true
	inv.Profile("hypervisor").Storage = &inventory.Storage{Root: inventory.RootLayout{RAID: inventory.StorageRAID1, Disks: inventory.DiskMatch{Rotational: &ssd}, Size: "100GiB"},
		VolumeGroups: []inventory.VolumeGroup{{Name: "vg0", From: inventory.VGOnRest, Volumes: []inventory.LogicalVolume{{Name: "logs", Size: "20GiB", Filesystem: "ext4", MountPoint: "/var/log"}}},
			{Name: "vg-data", From: inventory.VGOnDisks, RAID: inventory.StorageRAID1, Disks: inventory.DiskMatch{Rotational: &hdd}}}}
	srv.Hardware = &state.Hardware{Disks: []state.Disk{{Name: "sdb", SizeBytes: 480 << 30, ByPath: "pci-0000:00:1f.2-ata-2"}, {Name: "sda", SizeBytes: 480 << 30, WWN: "naa.5002538e40a1b2c1"},
		{Name: "sdc", SizeBytes: 4000 << 30, Rotational: true, ByPath: "pci-0000:00:1f.2-ata-3"}, {Name: "sdd", SizeBytes: 4000 << 30, Rotational: true, ByPath: "pci-0000:00:1f.2-ata-4"}}}
	if plan, err = p.DeployPlan(context.Background(), srv); err != nil {
		t.Fatal(err)
	}
	wantStorage := &v1.StoragePlan{Root: v1.StorageRoot{RAID: "raid1", SizeBytes: 100 << 30, Disks: []v1.StorageDiskRef{
		{Name: "sda", WWN: "naa.5002538e40a1b2c1", SizeBytes: 480 << 30}, {Name: "sdb", ByPath: "pci-0000:00:1f.2-ata-2", SizeBytes: 480 << 30}}},
		VolumeGroups: []v1.StorageVolumeGroup{{Name: "vg0", Rest: true, Volumes: []v1.StorageVolume{{Name: "logs", SizeBytes: 20 << 30, Filesystem: "ext4", MountPoint: "/var/log"}}},
			{Name: "vg-data", RAID: "raid1", Disks: []v1.StorageDiskRef{{Name: "sdc", ByPath: "pci-0000:00:1f.2-ata-3", SizeBytes: 4000 << 30}, {Name: "sdd", ByPath: "pci-0000:00:1f.2-ata-4", SizeBytes: 4000 << 30}}}}}
	if d := cmp.Diff(wantStorage, plan.Storage); d != "" {
		t.Errorf("storage plan (-want +got):\n%s", d)
	}
	srv.Hardware.Disks = srv.Hardware.Disks[1:]
	if _, err := p.DeployPlan(context.Background(), srv); err == nil || !strings.Contains(err.Error(), "root needs 2 disks") {
		t.Errorf("DeployPlan with one SSD left = %v, want the layout refused", err)
	}
	inv.Profile("hypervisor").Storage, srv.Hardware = nil, nil

	inv.Server("r1-n01").RootDevice = &inventory.RootDevice{Serial: "S1", MinSizeGiB: 200}
	if plan, err = p.DeployPlan(context.Background(), srv); err != nil {
		t.Fatal(err)
	}
	if want := (v1.RootDeviceHint{Serial: "S1", MinSizeBytes: 200 << 30}); plan.RootDevice != want {
		t.Errorf("plan disk rule with the server's rootDevice %+v, want %+v", plan.RootDevice, want)
	}

	// The last-step arch guard: an amd64 image is not planned
	// onto a server whose commissioning reported arm64; amd64 and arch-less
	// (older) reports still get their plan.
	for arch, wantErr := range map[string]bool{"arm64": true, "amd64": false, "": false} {
		srv.Hardware = &state.Hardware{Arch: arch}
		_, err := p.DeployPlan(context.Background(), srv)
		if wantErr && (err == nil || !strings.Contains(err.Error(), "image ubuntu-24.04 is amd64; server r1-n01 reported arm64: refusing to write it")) {
			t.Errorf("DeployPlan on an arm64 server = %v, want the arch refusal", err)
		}
		if !wantErr && err != nil {
			t.Errorf("DeployPlan on a %q server = %v", arch, err)
		}
	}
	// With the SMBIOS arch: a 386 kernel on amd64 firmware takes the amd64
	// image, a 386 kernel alone does not, and a kernel/firmware conflict
	// refuses even an image of the kernel's arch.
	for _, c := range []struct {
		kernel, smbios, wantErr string
	}{
		{"386", "amd64", ""},
		{"386", "", "image ubuntu-24.04 is amd64; server r1-n01 reported 386: refusing to write it"},
		{"amd64", "arm64", "server r1-n01: kernel reported arch amd64, SMBIOS firmware states arm64: refusing to write an image"},
	} {
		srv.Hardware = &state.Hardware{Arch: c.kernel, SMBIOSArch: c.smbios}
		_, err := p.DeployPlan(context.Background(), srv)
		if c.wantErr == "" && err != nil || c.wantErr != "" && (err == nil || !strings.Contains(err.Error(), c.wantErr)) {
			t.Errorf("DeployPlan on kernel %q, SMBIOS %q = %v, want %q", c.kernel, c.smbios, err, c.wantErr)
		}
	}
}
