package agent

import (
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/ramdisk/agent/agenttest"
)

var update = flag.Bool("update", false, "rewrite golden files")

// machineRoot materialises testdata/machines/<name>.tree into a temp dir.
func machineRoot(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata/machines", name+".tree"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := agenttest.WriteTree(dir, b); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestCollectFactsGolden(t *testing.T) {
	for _, m := range []string{"supermicro-nvme-sata", "amd-epyc-nodmi", "qemu-q35"} {
		t.Run(m, func(t *testing.T) {
			f, err := CollectFacts(machineRoot(t, m))
			if err != nil {
				t.Fatalf("CollectFacts: %v", err)
			}
			got, _ := json.MarshalIndent(f, "", "  ")
			golden := filepath.Join("testdata/machines", m+".facts.golden.json")
			if *update {
				if err := os.WriteFile(golden, append(got, '\n'), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run go test -update)", err)
			}
			if d := cmp.Diff(strings.TrimSpace(string(want)), strings.TrimSpace(string(got))); d != "" {
				t.Errorf("facts differ from %s (-want +got):\n%s", golden, d)
			}
		})
	}
}

// TestCollectFactsSemantics checks the facts that the golden files encode, so
// a careless -update cannot hide a regression in the parts that matter.
func TestCollectFactsSemantics(t *testing.T) {
	sm, err := CollectFacts(machineRoot(t, "supermicro-nvme-sata"))
	if err != nil {
		t.Fatal(err)
	}
	if c := sm.CPU; c.Sockets != 1 || c.Cores != 6 || c.Threads != 12 || c.Online != 12 || c.Virtualization != "vmx" {
		t.Errorf("supermicro CPU = %+v, want 1 socket, 6 cores, 12 threads, 12 online, vmx", c)
	}
	if sm.CPU.SMBIOSArch != "amd64" { // type 4-0: Processor Family B3h, Intel Xeon
		t.Errorf("supermicro SMBIOSArch = %q, want amd64 (type 4 family Xeon)", sm.CPU.SMBIOSArch)
	}
	if sm.Memory.TotalBytes != 32617788*1024 {
		t.Errorf("MemTotal = %d", sm.Memory.TotalBytes)
	}
	wantDIMMs := []v1.DIMM{
		{Locator: "DIMMA1", SizeBytes: 16 << 30, Type: "DDR4", SpeedMTs: 2666, Manufacturer: "Samsung", Serial: "41A2B3C4", PartNumber: "M391A2K43DB1-CTD"},
		{Locator: "DIMMB1", SizeBytes: 16 << 30, Type: "DDR4", SpeedMTs: 2666, Manufacturer: "Samsung", Serial: "41A2B3C5", PartNumber: "M391A2K43DB1-CTD"},
	}
	if d := cmp.Diff(wantDIMMs, sm.Memory.DIMMs); d != "" {
		t.Errorf("DIMMs (-want +got):\n%s", d)
	}
	byName := map[string]v1.Disk{}
	for _, d := range sm.Disks {
		byName[d.Name] = d
	}
	if len(sm.Disks) != 5 {
		t.Errorf("got %d disks, want 5 (loop0 skipped)", len(sm.Disks))
	}
	checks := []struct {
		name, byPath, serial, wwn, transport string
		rot, removable, virtual              bool
	}{
		{"nvme0n1", "pci-0000:3b:00.0-nvme-1", "S45NNE0M123456", "eui.0025388b91234567", "nvme", false, false, false},
		{"sda", "pci-0000:00:17.0-ata-1", "ZC1ABCDE", "naa.5000c500a1b2c3d4", "sata", true, false, false},
		{"sdb", "pci-0000:00:14.0-usb-0:3:1.0-scsi-0:0:0:0", "4C530001230815117342", "", "usb", false, true, false},
		{"sdc", "pci-0000:00:14.0-usb-0:4:1.0-scsi-0:0:0:0", "", "", "usb", false, false, true},
	}
	for _, c := range checks {
		d := byName[c.name]
		if d.ByPath != c.byPath || d.Serial != c.serial || d.WWN != c.wwn || d.Transport != c.transport ||
			d.Rotational != c.rot || d.Removable != c.removable || d.Virtual != c.virtual {
			t.Errorf("disk %s = %+v, want byPath %q serial %q wwn %q transport %q rot %v removable %v virtual %v",
				c.name, d, c.byPath, c.serial, c.wwn, c.transport, c.rot, c.removable, c.virtual)
		}
	}
	if byName["nvme0n1"].Model != "SAMSUNG MZ1LB960HAJQ-00007" {
		t.Errorf("nvme model %q not trimmed", byName["nvme0n1"].Model)
	}
	var nics []string
	for _, n := range sm.NICs {
		nics = append(nics, n.Name+"/"+n.Driver+"/"+n.MAC)
	}
	if d := cmp.Diff([]string{"eno1/igb/3c:ec:ef:12:34:56", "eno2/igb/3c:ec:ef:12:34:57", "enp1s0f0/ixgbe/a0:36:9f:aa:bb:cc"}, nics); d != "" {
		t.Errorf("NICs (lo and docker0 must be skipped) (-want +got):\n%s", d)
	}
	if sm.NICs[2].SpeedMbps != 10000 || !sm.NICs[2].Link || sm.NICs[1].Link || sm.NICs[1].SpeedMbps != 0 {
		t.Errorf("NIC link/speed = %+v", sm.NICs)
	}
	if sm.DMI.SystemUUID != "00000000-0000-0000-0000-3cecef123456" || sm.DMI.BoardProduct != "X11SCM-F" {
		t.Errorf("DMI = %+v", sm.DMI)
	}

	amd, err := CollectFacts(machineRoot(t, "amd-epyc-nodmi"))
	if err != nil {
		t.Fatal(err)
	}
	if c := amd.CPU; c.Sockets != 2 || c.Cores != 8 || c.Threads != 16 || c.Virtualization != "svm" {
		t.Errorf("amd CPU = %+v, want 2 sockets, 8 cores, 16 threads, svm", c)
	}
	if amd.DMI != (v1.DMI{}) || len(amd.Memory.DIMMs) != 0 || amd.CPU.SMBIOSArch != "" {
		t.Errorf("no-DMI machine reported DMI %+v DIMMs %v SMBIOSArch %q", amd.DMI, amd.Memory.DIMMs, amd.CPU.SMBIOSArch)
	}
	if amd.Disks[0].Name != "nvme0n1" || amd.Disks[1].ByPath != "pci-0000:03:00.0-scsi-0:2:0:0" || amd.NICs[0].SpeedMbps != 25000 {
		t.Errorf("amd disks/NICs = %+v %+v", amd.Disks, amd.NICs)
	}

	q, err := CollectFacts(machineRoot(t, "qemu-q35"))
	if err != nil {
		t.Fatal(err)
	}
	if len(q.Disks) != 1 || q.Disks[0].ByPath != "pci-0000:00:04.0" || q.Disks[0].Serial != "machina-vm0" || q.Disks[0].Transport != "virtio" {
		t.Errorf("qemu disks = %+v, want only vda (sr0 skipped)", q.Disks)
	}
	if q.CPU.Virtualization != "" || q.CPU.Threads != 2 || q.CPU.Sockets != 2 || q.CPU.SMBIOSArch != "" { // QEMU's family is 01h Other
		t.Errorf("qemu CPU = %+v", q.CPU)
	}
}

func TestCollectFactsNoCPUInfo(t *testing.T) {
	if _, err := CollectFacts(t.TempDir()); err == nil {
		t.Fatal("CollectFacts on empty root succeeded")
	}
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "proc"), 0o755)
	os.WriteFile(filepath.Join(dir, "proc/cpuinfo"), []byte("garbage\n"), 0o644)
	if _, err := CollectFacts(dir); err == nil || !strings.Contains(err.Error(), ErrNoCPUInfo.Error()) {
		t.Fatalf("err = %v, want ErrNoCPUInfo", err)
	}
}

func TestCountCPUList(t *testing.T) {
	for in, want := range map[string]int{"0": 1, "0-3": 4, "0-3,8,10-11": 7, "0-63\n": 64} {
		if got, err := countCPUList(in); err != nil || got != want {
			t.Errorf("countCPUList(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"a", "3-1", "0-x"} {
		if _, err := countCPUList(bad); err == nil {
			t.Errorf("countCPUList(%q) succeeded", bad)
		}
	}
}

func FuzzParseDMIMemoryDevice(f *testing.F) {
	f.Add([]byte{17, 0x15, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x00, 0x40, 0x09, 0, 1, 0, 0x1A, 0, 0, 'A', 0, 0})
	f.Add([]byte{17, 0x28})
	f.Fuzz(func(t *testing.T, raw []byte) {
		if len(raw) > 4096 {
			return
		}
		d, ok, err := ParseDMIMemoryDevice(raw)
		if err == nil && ok && d.SizeBytes <= 0 {
			t.Errorf("ok with size %d", d.SizeBytes)
		}
	})
}

// TestReadGPUs: display controllers (PCI class 03h) are listed with their
// vendor named, a BMC's ASPEED VGA is not a GPU, other classes are ignored,
// and vendor_id and the kernel arch reach the CPU facts.
func TestReadGPUs(t *testing.T) {
	root := t.TempDir()
	write := func(rel, content string) {
		t.Helper()
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for addr, dev := range map[string][3]string{
		"0000:03:00.0": {"0x030000", "0x1a03", "0x2000"}, // ASPEED AST2500 (BMC VGA)
		"0000:3b:00.0": {"0x030200", "0x10de", "0x20b5"}, // NVIDIA A100 (3D controller)
		"0000:00:1f.2": {"0x010601", "0x8086", "0xa352"}, // SATA controller
	} {
		write("sys/bus/pci/devices/"+addr+"/class", dev[0])
		write("sys/bus/pci/devices/"+addr+"/vendor", dev[1])
		write("sys/bus/pci/devices/"+addr+"/device", dev[2])
	}
	got := readGPUs(root)
	want := []v1.GPU{{PCIAddress: "0000:3b:00.0", VendorID: "0x10de", DeviceID: "0x20b5", Vendor: "nvidia"}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("readGPUs (-want +got):\n%s", diff)
	}
	write("proc/cpuinfo", "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC\n")
	write("proc/sys/kernel/arch", "aarch64")
	c, err := readCPU(root)
	if err != nil {
		t.Fatal(err)
	}
	if c.Vendor != "AuthenticAMD" || c.Arch != "arm64" {
		t.Errorf("readCPU vendor, arch = %q, %q; want AuthenticAMD, arm64", c.Vendor, c.Arch)
	}
}

// TestPCIAddress: the PCI function a NIC's device link names, for a PCI
// NIC (the link's own last element) and a virtio NIC (its parent); none
// for a NIC off PCI.
func TestPCIAddress(t *testing.T) {
	for link, want := range map[string]string{
		"../../../0000:3b:00.1":                                                  "0000:3b:00.1",
		"../../../devices/pci0000:00/0000:00:03.0/virtio0":                       "0000:00:03.0",
		"../../../devices/pci0000:00/0000:00:1c.0/0000:02:00.0":                  "0000:02:00.0",
		"../../../devices/platform/soc/fe300000.ethernet":                        "",
		"../../../devices/pci0000:00/0000:00:01.0/0000:01:00.0/usb2/2-1/2-1:1.0": "0000:01:00.0",
	} {
		if got := pciAddress(link); got != want {
			t.Errorf("pciAddress(%q) = %q, want %q", link, got, want)
		}
	}
}
