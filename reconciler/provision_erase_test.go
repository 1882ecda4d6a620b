package reconciler

import (
	"reflect"
	"testing"

	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/reconciler/plan/plantest"
	"github.com/machina-metal/machina/state"
)

// TestProvisionRecordsEraseDisks: a server allocated through the
// provision API records each commissioned disk's release erase method,
// as the plan's allocate step does: the profile's NVMe override (secure)
// for the NVMe disk, its erase (zero) for the SATA disk.
func TestProvisionRecordsEraseDisks(t *testing.T) {
	st := openEnrolStore(t)
	inv := plantest.CloneInv(exampleInventory(t))
	p := inv.Profile("hypervisor")
	p.Erase = inventory.EraseZero
	p.EraseOverrides = []inventory.EraseOverride{{Disks: inventory.DiskMatch{Transport: "nvme"}, Method: inventory.EraseSecure}}
	ws := inv.Server("r1-n01")
	hw := plantest.BigHW(ws.Name)
	hw.Disks = []state.Disk{
		{Name: "nvme0n1", SizeBytes: 960 << 30, ByPath: "pci-0000:3b:00.0-nvme-1", Transport: "nvme"},
		{Name: "sda", SizeBytes: 480 << 30, Serial: "ZC1ABCDE", Transport: "sata", Rotational: true},
	}
	if _, err := st.CreateServer(state.Server{Name: ws.Name, Zone: ws.Zone, Site: ws.Site, Rack: ws.Rack, BootMAC: ws.BootMAC, BootMode: string(ws.BootMode), Hardware: hw}); err != nil {
		t.Fatal(err)
	}
	for _, to := range []state.Lifecycle{state.LifecycleCommissioning, state.LifecycleReady} {
		s, _ := st.Server(ws.Name)
		if _, err := st.Transition(ws.Name, s.Lifecycle, to, "test"); err != nil {
			t.Fatal(err)
		}
	}
	c, err := New(Config{Store: st, Drivers: &countingDrivers{d: &recordingDriver{}}, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	c.SetDesired(inv)
	names, err := c.Provision("hypervisor", 1, "test")
	if err != nil || len(names) != 1 || names[0] != ws.Name {
		t.Fatalf("Provision = %v, %v; want %s", names, err, ws.Name)
	}
	s, _ := st.Server(ws.Name)
	want := []state.EraseDisk{
		{Name: "nvme0n1", ByPath: "pci-0000:3b:00.0-nvme-1", SizeBytes: 960 << 30, Method: "secure"},
		{Name: "sda", Serial: "ZC1ABCDE", SizeBytes: 480 << 30, Method: "zero"},
	}
	if s.Allocation == nil || s.Allocation.Erase != "zero" || !reflect.DeepEqual(s.Allocation.EraseDisks, want) {
		t.Fatalf("allocation %+v, want erase zero and per disk %+v", s.Allocation, want)
	}
}
