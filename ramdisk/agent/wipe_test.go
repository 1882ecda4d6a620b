package agent

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	v1 "github.com/machina-metal/machina/api/v1"
)

// TestWipeDisk wipes a disk holding an old GPT layout (a root partition,
// config-2 and a cidata FAT filesystem near the end) and checks with
// util-linux's own probes that no partition table and no signature is
// left, while data between the wiped ranges stays (no full erase).
func TestWipeDisk(t *testing.T) {
	need(t, "sgdisk", "blkid", "sfdisk")
	const size = 64 << 20
	f, before := newTarget(t, size)
	probe := func(file string, off int64) string {
		out, _ := exec.Command("blkid", "-p", "-O", strconv.FormatInt(off, 10), "-o", "export", file).Output()
		return string(out)
	}
	p := filepath.Join(t.TempDir(), "before")
	if err := os.WriteFile(p, before, 0o644); err != nil {
		t.Fatal(err)
	}
	if got := probe(p, 0); !strings.Contains(got, "PTTYPE=gpt") {
		t.Fatalf("layout before the wipe has no GPT: %q", got)
	}
	tbl, err := readPartTable(bytes.NewReader(before), size)
	if err != nil || len(tbl.parts) != 3 {
		t.Fatalf("old layout: %d partitions, %v; want 3", len(tbl.parts), err)
	}
	sawSeed := false
	for _, part := range tbl.parts {
		if strings.Contains(probe(p, part[0]), "LABEL=CIDATA") {
			sawSeed = true
		}
	}
	if !sawSeed {
		t.Fatal("probe does not see the old cidata filesystem before the wipe; the test proves nothing")
	}

	if err := WipeDisk(f, size); err != nil {
		t.Fatal(err)
	}
	after, err := os.ReadFile(f.Name())
	if err != nil {
		t.Fatal(err)
	}
	if got := probe(f.Name(), 0); strings.Contains(got, "PTTYPE") || strings.Contains(got, "TYPE=") {
		t.Errorf("whole disk still probes as %q", got)
	}
	if out, err := exec.Command("sfdisk", "--dump", f.Name()).CombinedOutput(); err == nil {
		t.Errorf("sfdisk still reads a partition table:\n%s", out)
	}
	for _, part := range tbl.parts {
		if got := probe(f.Name(), part[0]); strings.Contains(got, "TYPE=") {
			t.Errorf("signature at %d survived: %s", part[0], got)
		}
	}
	if bytes.Contains(after[:1<<20], []byte("EFI PART")) || bytes.Contains(after[size-(1<<20):], []byte("EFI PART")) {
		t.Error("a GPT header survived")
	}
	// A wipe, not an erase: the middle of the old root partition is intact.
	mid := tbl.parts[0][0] + 4<<20
	if !bytes.Equal(before[mid:mid+4096], after[mid:mid+4096]) {
		t.Error("data inside the old root partition changed: WipeDisk should only clear labels")
	}
}

func TestWipeTargets(t *testing.T) {
	disks := []v1.Disk{
		{Name: "sda", SizeBytes: 100 << 30, Serial: "S1", ByPath: "pci-0000:00:17.0-ata-1"},
		{Name: "sdb", SizeBytes: 200 << 30, Serial: "S2"},
		{Name: "sdc", SizeBytes: 8 << 30, Transport: "usb"},
		{Name: "sr0", SizeBytes: 1 << 30, Virtual: true},
		{Name: "sdd", SizeBytes: 1 << 30, Removable: true},
		{Name: "sde", SizeBytes: 2 << 30},
	}
	ids := func(ds []v1.Disk) []string {
		var s []string
		for _, d := range ds {
			s = append(s, d.Name)
		}
		return s
	}
	all, err := WipeTargets(disks, v1.RootDeviceHint{}, map[string]bool{"sde": true})
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff([]string{"sda", "sdb"}, ids(all)); d != "" {
		t.Errorf("no hint (-want +got):\n%s", d)
	}
	one, err := WipeTargets(disks, v1.RootDeviceHint{Serial: "s2"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff([]string{"sdb"}, ids(one)); d != "" {
		t.Errorf("serial hint (-want +got):\n%s", d)
	}
	if _, err := WipeTargets(disks, v1.RootDeviceHint{DeviceName: "/dev/sda"}, nil); !errors.Is(err, ErrKernelNameHint) {
		t.Errorf("kernel-name hint: %v, want ErrKernelNameHint", err)
	}
	if _, err := WipeTargets(disks[2:5], v1.RootDeviceHint{}, nil); !errors.Is(err, ErrNoDisk) {
		t.Errorf("only ineligible disks: %v, want ErrNoDisk", err)
	}
}
