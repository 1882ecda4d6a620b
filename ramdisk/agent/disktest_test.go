package agent

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	v1 "github.com/machina-metal/machina/api/v1"
)

// TestDiskReadTestFailsWithoutDisk: the commissioning disk test fails with
// ErrNoDiskToTest when the machine has no disk, or only virtual media (a
// BMC's virtual CD), rather than pass having read nothing; with a real
// disk (a file standing in for its device node) it reads it and passes.
// The controller's report check then refuses a report whose disk test
// passed without a disk (api TestReportSchemaAndChecksAgree).
func TestDiskReadTestFailsWithoutDisk(t *testing.T) {
	dev := t.TempDir()
	for name, disks := range map[string][]v1.Disk{
		"no disk":            nil,
		"only virtual media": {{Name: "sr0", SizeBytes: 1 << 20, Virtual: true}},
	} {
		if _, err := DiskReadTest(context.Background(), dev, disks, 4096); !errors.Is(err, ErrNoDiskToTest) {
			t.Errorf("%s: DiskReadTest = %v, want ErrNoDiskToTest", name, err)
		}
	}
	if err := os.WriteFile(filepath.Join(dev, "sda"), make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	m, err := DiskReadTest(context.Background(), dev, []v1.Disk{{Name: "sda", SizeBytes: 1 << 20}, {Name: "sr0", Virtual: true}}, 4096)
	if err != nil || m["disks"] != 1 || m["bytes"] != 3*4096 {
		t.Errorf("with a disk: %v, %v; want 1 disk, 3 reads of 4096 bytes", m, err)
	}
}
