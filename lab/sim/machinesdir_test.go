package sim

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/machina-metal/machina/ramdisk/agent"
)

// TestMachinesDir: with Config.MachinesDir the machines' trees and disk
// files are written there and not in Dir, and the real agent reads the
// same hardware from them; a second lab on the same folders starts over.
func TestMachinesDir(t *testing.T) {
	dir, machines := t.TempDir(), t.TempDir()
	for range 2 {
		l, err := Start(context.Background(), Config{Dir: dir, MachinesDir: machines, Servers: 3, RedfishOnly: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(l.Close)
		if _, err := os.Stat(filepath.Join(dir, "machines")); !os.IsNotExist(err) {
			t.Errorf("Dir/machines: %v, want it absent", err)
		}
		for _, m := range l.Machines() {
			if p := m.DiskPath("sda"); !strings.HasPrefix(p, filepath.Join(machines, "machines")+"/") {
				t.Errorf("%s: disk %s, not under MachinesDir", m.Name, p)
			}
			f, err := agent.CollectFacts(m.root)
			if err != nil {
				t.Fatalf("%s: %v", m.Name, err)
			}
			if f.DMI.SystemSerial != m.HW.Serial || len(f.Disks) != len(m.HW.DisksGiB) || len(f.NICs) == 0 || f.NICs[0].MAC != m.MAC {
				t.Errorf("%s: facts serial %q, %d disks, NICs %v; want %q, %d disks, %s", m.Name, f.DMI.SystemSerial, len(f.Disks), f.NICs, m.HW.Serial, len(m.HW.DisksGiB), m.MAC)
			}
		}
		l.Close()
	}
}
