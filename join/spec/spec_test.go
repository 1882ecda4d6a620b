package spec_test

import (
	"errors"
	"strings"
	"testing"

	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/join/spec"
)

func TestEnrolmentReportsEveryBadField(t *testing.T) {
	err := spec.Enrolment(v1.EnrolmentRequest{
		Site:     "Lab_1",
		Tags:     []string{"ok", "not ok"},
		Networks: []v1.JoinNetwork{{Name: "a", Bridge: "br0", NIC: "eth0", VLAN: 5000}, {Name: "b", Bridge: "br0", NIC: "eth1"}},
		Pools:    []v1.JoinPool{{Name: "vg", Type: "lvm", Disks: []string{"/dev/sdb", "/dev/sdb"}}, {Name: "d", Type: "dir", Path: "/proc/x"}},
		Require:  []string{"gpu"},
	})
	if !errors.Is(err, spec.ErrInvalid) {
		t.Fatalf("Enrolment = %v, want ErrInvalid", err)
	}
	for _, field := range []string{"site:", "tags[1]:", "networks[0].vlan:", "networks[1].bridge:", "pools[0].disks[1]:", "pools[1].path:", "require[0]:"} {
		if !strings.Contains(err.Error(), field) {
			t.Errorf("error lacks %s:\n%v", field, err)
		}
	}
	var fe *spec.FieldError
	if !errors.As(err, &fe) {
		t.Fatal("no *FieldError in the joined error")
	}
}

func TestValidSpecs(t *testing.T) {
	ok := v1.EnrolmentRequest{Site: "lab1", Rack: "r1", Tags: []string{"kvm", "nvme.fast"}, Require: []string{"kvm", "virt", "memory"},
		Networks: []v1.JoinNetwork{{Name: "prod", Bridge: "br-prod", NIC: "enp0s31f6", VLAN: 4094, CIDR: "2001:db8::5/64"}},
		Pools: []v1.JoinPool{{Name: "images", Type: "dir", Path: "/srv/images"}, {Name: "vg_data", Type: "lvm",
			Disks: []string{"/dev/disk/by-id/nvme-SAMSUNG_123", "/dev/sdc"}}}}
	if err := spec.Enrolment(ok); err != nil {
		t.Fatalf("Enrolment(valid) = %v", err)
	}
	if got := spec.VLANName("enp0s31f6np0", 4094); got != "vlan4094" {
		t.Errorf("VLANName(long nic) = %q, want vlan4094 (15-byte limit)", got)
	}
	if got := spec.VLANName("eth1", 20); got != "eth1.20" {
		t.Errorf("VLANName = %q, want eth1.20", got)
	}
}
