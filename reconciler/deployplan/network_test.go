package deployplan

import (
	"context"
	"encoding/json"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/machina-metal/machina/deploy/netplan"
	"github.com/machina-metal/machina/images"
	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/state"
)

// poolIPAM is an AddressSource that hands out fixed answers.
type poolIPAM map[string][]netip.Addr

func (p poolIPAM) PoolAddresses(context.Context, state.Server, inventory.Profile) (map[string][]netip.Addr, error) {
	return p, nil
}

// TestDeployPlanNetworkLayout: the example storage profile's layout is
// rendered into the seed for the NIC the server's commissioning found,
// with its servers.yaml addresses, and its cloudInit goes into the seed; a
// server whose report lacks the NIC gets no plan (the error names the
// ethernet); a pool-mode interface gets no plan without IPAM (never DHCP
// instead) and its assigned address with it.
func TestDeployPlanNetworkLayout(t *testing.T) {
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
	rec := images.Record{Name: "debian-12", Source: "http://mirror.invalid/debian.img", State: images.StateVerified, SizeBytes: 2 << 30,
		Raw: images.Digest{Algo: "sha256", Hex: strings.Repeat("cd", 32)}}
	b, _ := json.Marshal(rec)
	if err := os.WriteFile(filepath.Join(dir, "images", "debian-12.json"), b, 0o640); err != nil {
		t.Fatal(err)
	}
	p := &Planner{Desired: func() *inventory.Inventory { return inv }, Images: store, BaseURL: "http://10.99.0.1:8080", Join: fixedJoin{}}
	srv := state.Server{Name: "r2-n01", BootMAC: "52:54:00:02:00:01", Lifecycle: state.LifecycleDeploying,
		Allocation: &state.Allocation{Profile: "storage", Image: "debian-12", At: time.Unix(1700000000, 0)},
		Hardware: &state.Hardware{NICs: []state.NIC{
			{Name: "enp59s0f1", MAC: "b4:96:91:00:00:11", Driver: "ice", PCIAddress: "0000:3b:00.1", SpeedMbps: 25000},
			{Name: "eno1", MAC: "52:54:00:02:00:01", Driver: "igb", PCIAddress: "0000:02:00.0", SpeedMbps: 1000},
		}}}
	plan, err := p.DeployPlan(context.Background(), srv)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{`macaddress: "52:54:00:02:00:01"`, `set-name: "uplink0"`, `- "10.20.0.21/24"`, `- "fd00:30::21/64"`, "id: 130", "mtu: 9000"} {
		if !strings.Contains(plan.Seed.NetworkConfig, w) {
			t.Errorf("network-config lacks %s:\n%s", w, plan.Seed.NetworkConfig)
		}
	}

	noNIC := srv
	noNIC.Hardware = &state.Hardware{}
	if _, err := p.DeployPlan(context.Background(), noNIC); err == nil || !strings.Contains(err.Error(), "ethernet uplink0 (name=e* index=0): no NIC of the commissioning report matches") {
		t.Errorf("DeployPlan without NICs = %v, want the missing ethernet named", err)
	}

	st := inv.Profile("storage")
	st.Network.VLANs[0].Address = inventory.AddressPool
	st.Network.VLANs[0].Subnet = "tenant"
	st.Network.VLANs[0].ID = 120
	_, err = p.DeployPlan(context.Background(), srv)
	if !errors.Is(err, netplan.ErrNoAddress) || !strings.Contains(err.Error(), "storage0") {
		t.Errorf("DeployPlan of a pool interface without IPAM = %v, want ErrNoAddress naming storage0", err)
	}
	p.Addresses = poolIPAM{"storage0": {netip.MustParseAddr("10.120.0.77")}}
	if plan, err = p.DeployPlan(context.Background(), srv); err != nil || !strings.Contains(plan.Seed.NetworkConfig, `- "10.120.0.77/22"`) {
		t.Errorf("DeployPlan with IPAM = %v; network-config:\n%s", err, plan.Seed.NetworkConfig)
	}

	// The controller's IPAM: the leases the allocation took for this
	// profile; one taken for another profile is not this deploy's.
	p.Addresses = Leases{}
	leased := srv
	leased.Addresses = []state.AddressLease{{Subnet: "tenant", Interface: "storage0", Address: "10.120.0.10", Profile: "storage"},
		{Subnet: "tenant", Interface: "storage0", Address: "10.120.0.99", Profile: "hypervisor"}}
	if plan, err = p.DeployPlan(context.Background(), leased); err != nil || !strings.Contains(plan.Seed.NetworkConfig, `- "10.120.0.10/22"`) || strings.Contains(plan.Seed.NetworkConfig, "10.120.0.99") {
		t.Errorf("DeployPlan with leases = %v; network-config:\n%s", err, plan.Seed.NetworkConfig)
	}
	if _, err = p.DeployPlan(context.Background(), srv); !errors.Is(err, netplan.ErrNoAddress) {
		t.Errorf("DeployPlan without a lease = %v, want ErrNoAddress", err)
	}
	p.Addresses = poolIPAM{"storage0": {netip.MustParseAddr("10.120.0.77")}}

	st.CloudInit = &inventory.CloudInit{UserData: map[string]any{"packages": []any{"chrony"}}, VendorData: map[string]any{"timezone": "UTC"}}
	if plan, err = p.DeployPlan(context.Background(), srv); err != nil || string(plan.Seed.UserData) != `{"packages":["chrony"]}` || string(plan.Seed.VendorData) != `{"timezone":"UTC"}` {
		t.Errorf("DeployPlan with cloudInit = %v; user-data %s vendor-data %s", err, plan.Seed.UserData, plan.Seed.VendorData)
	}
}
