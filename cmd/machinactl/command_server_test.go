package main

import (
	"strings"
	"testing"

	"github.com/machina-metal/machina/discover"
	"github.com/machina-metal/machina/inventory"
)

// TestServerBMCSetOnAutoEnrolledEntry: `server bmc-set` adds a bmc block to
// an auto-enrolled machine's entry (which has none) on its proposal branch,
// and the branch's inventory then names that BMC; main is untouched.
func TestServerBMCSetOnAutoEnrolledEntry(t *testing.T) {
	repo := exampleClone(t)
	raw, _, err := discover.ReadInventory(repo, "main")
	if err != nil {
		t.Fatal(err)
	}
	proposed, err := discover.AppendEntries(raw, []discover.Entry{{Name: "auto-5254005e0001", Zone: "discovered", Tags: []string{"auto-enrolled"},
		BootMAC: "52:54:00:5e:00:01", BootMode: "uefi", Comment: []string{"auto-enrolled 2026-11-29T21:29:02Z via ipxe; commissioning: ready"}}})
	if err != nil {
		t.Fatal(err)
	}
	const branch = "discovered/2026-11-29"
	if _, err := discover.Commit(discover.Change{Repo: repo, Base: "main", Branch: branch, Message: "auto-enrolled: 1 server"}, proposed); err != nil {
		t.Fatal(err)
	}
	code, out, errs := runScanCtl(t, "server", "bmc-set", "auto-5254005e0001", "--driver", "ipmi", "--address", "10.10.9.31",
		"--credentials", "bmc-ipmi", "--repo", repo, "--branch", branch)
	if code != 0 || !strings.Contains(out, "committed") || !strings.Contains(out, branch) {
		t.Fatalf("bmc-set on %s: exit %d\n%s\n%s", branch, code, out, errs)
	}
	_, inv, err := discover.ReadInventory(repo, branch)
	if err != nil {
		t.Fatalf("branch after bmc-set: %v", err)
	}
	want := inventory.BMC{Driver: inventory.DriverIPMI, Address: "10.10.9.31", Credentials: "bmc-ipmi"}
	if s := inv.Server("auto-5254005e0001"); s == nil || s.BMC != want {
		t.Fatalf("entry after bmc-set: %+v", s)
	}
	if _, main, err := discover.ReadInventory(repo, "main"); err != nil || main.Server("auto-5254005e0001") != nil {
		t.Errorf("main changed: %v", err)
	}
}
