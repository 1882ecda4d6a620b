package uitest

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/machina-metal/machina/bmc"
	"github.com/machina-metal/machina/state"
	"github.com/machina-metal/machina/ui"
)

// seedServer is one simulated server and the lifecycle path it walks.
type seedServer struct {
	name, zone, rack, mac, health string
	path                          []state.Lifecycle // moves from new
	power                         state.Power
}

var fleet = []seedServer{
	{"r1-n01", "zone-a", "r1", "52:54:00:01:00:01", "OK", []state.Lifecycle{"commissioning", "ready"}, state.PowerOn},
	{"r1-n02", "zone-a", "r1", "52:54:00:01:00:02", "OK", []state.Lifecycle{"commissioning"}, state.PowerOn},
	{"r1-n03", "zone-a", "r1", "52:54:00:01:00:03", "OK", []state.Lifecycle{"commissioning", "ready", "allocated", "deploying", "deployed"}, state.PowerOn},
	{"r1-n04", "zone-a", "r1", "52:54:00:01:00:04", "Warning", []state.Lifecycle{"commissioning", "ready"}, state.PowerOff},
	{"r2-n01", "zone-b", "r2", "52:54:00:02:00:01", "", nil, state.PowerRegistered},
	{"r2-n02", "zone-b", "r2", "52:54:00:02:00:02", "Critical", []state.Lifecycle{"commissioning", "failed"}, state.PowerOff},
	{"r2-n03", "zone-b", "r2", "52:54:00:02:00:03", "OK", []state.Lifecycle{"commissioning", "ready", "allocated"}, state.PowerOff},
	{"r3-n01", "zone-c", "r3", "52:54:00:03:00:01", "OK", []state.Lifecycle{"commissioning", "ready", "allocated", "deploying"}, state.PowerOn},
	{"r3-n02", "zone-c", "r3", "52:54:00:03:00:02", "", []state.Lifecycle{"commissioning", "ready", "retired"}, state.PowerOff},
	{"r3-n03", "zone-c", "r3", "52:54:00:03:00:03", "OK", []state.Lifecycle{"commissioning", "ready"}, state.PowerOn},
}

func seed(st *state.Store) error {
	for _, s := range fleet {
		_, err := st.CreateServer(state.Server{Name: s.name, Zone: s.zone, Site: "lab1", Rack: s.rack, BootMAC: s.mac,
			BMC: state.BMCFacts{Driver: "redfish", Address: "https://10.10." + s.rack[1:] + ".11", Credentials: "bmc-default"}})
		if err != nil {
			return err
		}
	}
	// Walk the paths interleaved, as a fleet comes up, so the chart has a history.
	from := map[string]state.Lifecycle{}
	for step := 0; ; step++ {
		moved := false
		for _, s := range fleet {
			if step >= len(s.path) {
				continue
			}
			f := from[s.name]
			if f == "" {
				f = state.LifecycleNew
			}
			to := s.path[step]
			m := state.Move{Server: s.name, From: f, To: to, Reason: reasonFor(to)}
			if to == state.LifecycleReady && f == state.LifecycleCommissioning {
				m.Update = func(srv *state.Server) error { srv.Hardware = hardware(s.name); return nil }
			}
			if to == state.LifecycleAllocated {
				m.Update = func(srv *state.Server) error {
					srv.Allocation = &state.Allocation{Profile: "hypervisor", Image: "ubuntu-24.04", At: time.Now().UTC(), Reason: "count"}
					return nil
				}
			}
			if to == state.LifecycleFailed {
				m.Update = func(srv *state.Server) error {
					srv.LastError = "commissioning test failed: disk nvme0n1 SMART status FAILED"
					return nil
				}
			}
			var err error
			if to == state.LifecycleAllocated && s.name == "r1-n03" {
				// r1-n03's profile layout has a pool interface: IPAM takes
				// its address with the allocation.
				pool := state.NewAddressPool("mgmt", []state.AddressRange{{Start: netip.MustParseAddr("10.20.0.100"), End: netip.MustParseAddr("10.20.0.199")}}, nil)
				_, err = st.ApplyClaiming(m, "hypervisor", []state.AddressClaim{{Interface: "eno1", Pool: pool}})
			} else {
				_, err = st.Apply(m)
			}
			if err != nil {
				return err
			}
			from[s.name] = to
			moved = true
		}
		if !moved {
			break
		}
	}
	for _, s := range fleet {
		if _, err := st.SetPower(s.name, s.power, state.PowerSourceBMC); err != nil {
			return err
		}
		h := s.health
		if _, err := st.UpdateServer(s.name, func(srv *state.Server) error { srv.Health = h; return nil }); err != nil {
			return err
		}
	}
	// r3-n01's deploy reports its write's progress; r2-n03's deploy
	// keeps failing and is retried.
	now := time.Now().UTC()
	if _, err := st.UpdateServer("r3-n01", func(srv *state.Server) error {
		srv.Progress = &state.Progress{Step: "image-write", BytesDone: 3 << 29, BytesTotal: 4 << 30, RateBytesPerSecond: 120 << 20, At: now, AdvancedAt: now}
		return nil
	}); err != nil {
		return err
	}
	if _, err := st.UpdateServer("r2-n03", func(srv *state.Server) error {
		srv.Failures, srv.RetryAt, srv.LastError = 2, now.Add(time.Minute), "deploy: set boot override: HTTP 503"
		return nil
	}); err != nil {
		return err
	}
	if _, err := st.PutHost(state.Host{Name: "hv-r1-n03", Server: "r1-n03", Site: "lab1", Rack: "r1", Tags: []string{"kvm", "nvme"},
		CertFingerprint: strings.Repeat("ab", 32), LastSeen: time.Now().UTC(), JoinStatus: "joined",
		Networks: []string{"br-mgmt", "br-vm"}, StoragePools: []string{"vmpool"}}); err != nil {
		return err
	}
	if _, err := st.PutHost(state.Host{Name: "hv-r9-n01", Site: "lab1", Rack: "r9", Tags: []string{"kvm"},
		LastSeen: time.Now().UTC().Add(-time.Hour)}); err != nil {
		return err
	}
	for _, e := range []state.JoinLogEntry{
		{Level: "info", Step: "join", Message: "node certificate issued (CN=hv-r1-n03)"},
		// Steps as join/node.Apply reports them: "network NAME", "pool NAME".
		{Level: "info", Step: "network br-mgmt", Message: "br-mgmt: vlan 10, 10.20.1.13/24"},
		{Level: "info", Step: "network br-vm", Message: "br-vm: vlan 200, no address"},
		{Level: "info", Step: "pool vmpool", Message: "vmpool: lvm on nvme0n1 (1.7 TiB)"},
		{Level: "info", Step: "heartbeat", Message: "first heartbeat"},
	} {
		if _, err := st.AppendJoinLog("hv-r1-n03", e); err != nil {
			return err
		}
	}
	return nil
}

func reasonFor(to state.Lifecycle) string {
	switch to {
	case state.LifecycleCommissioning:
		return "commission: PXE boot override, power on"
	case state.LifecycleReady:
		return "commissioning report accepted"
	case state.LifecycleAllocated:
		return "profile hypervisor count 2"
	case state.LifecycleDeploying:
		return "deploy ubuntu-24.04"
	case state.LifecycleDeployed:
		return "image written, booted from disk"
	case state.LifecycleFailed:
		return "commissioning tests failed"
	case state.LifecycleRetired:
		return "want: retired"
	}
	return ""
}

func hardware(name string) *state.Hardware {
	return &state.Hardware{Cores: 32, MemoryBytes: 128 << 30, Vendor: "Dell Inc.", Product: "PowerEdge R650", Serial: "SN-" + name,
		Disks: []state.Disk{{Name: "nvme0n1", SizeBytes: 1920383410176, Model: "Dell Ent NVMe P5600 MU"}, {Name: "sda", SizeBytes: 480103981056, Model: "MZ7KH480HAHQ", Rotational: false}},
		NICs: []state.NIC{{Name: "eno1", MAC: "52:54:00:aa:00:01", SpeedMbps: 25000, Link: true,
			LLDP: &state.LLDP{ChassisID: "0c:29:ef:00:00:01", SystemName: "leaf-" + name[:2] + "-a", PortID: "Ethernet1/" + name[len(name)-1:], PortIDSubtype: "ifname", PortVLAN: 100}}, {Name: "eno2", MAC: "52:54:00:aa:00:02", SpeedMbps: 25000}},
		ObservedAt: time.Now().UTC()}
}

// fakeBMC is the read model of the lab's BMCs: r1-* report everything,
// others are IPMI-like and miss temperatures detail, power draw and logs.
type fakeBMC struct{}

func (fakeBMC) BMCInfo(_ context.Context, server string) (*bmc.Info, error) {
	if server == "r2-n01" {
		return nil, fmt.Errorf("uitest: bmc %s: %w", server, bmc.ErrUnreachable)
	}
	w := 312.0
	info := &bmc.Info{Manufacturer: "Dell Inc.", Model: "PowerEdge R650", Serial: "SN-" + server, BIOSVersion: "1.9.2",
		BMCFirmware: "6.10.30.00", Health: "OK", Power: bmc.PowerState("On"),
		Temperatures: []bmc.Temperature{{Name: "CPU1 Temp", Celsius: 54, Health: "OK"}, {Name: "Inlet Temp", Celsius: 23.5, Health: "OK"}},
		PowerWatts:   &w,
		Firmware:     []bmc.FirmwareEntry{{Name: "BIOS", Version: "1.9.2"}, {Name: "iDRAC", Version: "6.10.30.00"}},
		Logs: []bmc.LogEntry{{Created: time.Date(2026, 11, 29, 8, 1, 0, 0, time.UTC), Severity: "OK", Message: "The system inventory was updated."},
			{Created: time.Date(2026, 11, 28, 22, 14, 0, 0, time.UTC), Severity: "Warning", Message: "Fan 3 RPM is below the lower warning threshold."}}}
	if !strings.HasPrefix(server, "r1-") {
		info.PowerWatts, info.Logs, info.Firmware = nil, nil, nil
		info.Missing = []string{"power", "firmware", "logs"}
	}
	return info, nil
}

// fakeImages is the image store's view: ubuntu-24.04 is downloading at
// 42% on the first call and verified from the second on, so the images
// page's progress polling has something to show.
type fakeImages struct {
	mu    sync.Mutex
	calls int
}

func (f *fakeImages) ImageStatuses(context.Context) ([]ui.ImageStatus, error) {
	f.mu.Lock()
	f.calls++
	n := f.calls
	f.mu.Unlock()
	ubuntu := ui.ImageStatus{Name: "ubuntu-24.04", State: "downloading", Percent: 42}
	if n > 1 {
		ubuntu = ui.ImageStatus{Name: "ubuntu-24.04", State: "verified", Percent: 100, SizeBytes: 3758096384,
			Digest: "sha256:0d8f1e2a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6"}
	}
	return []ui.ImageStatus{
		{Name: "alpine-rescue", State: "verified", Percent: 100, SizeBytes: 4 << 20, Digest: "sha256:4a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f9"},
		{Name: "custom", State: "pending", Percent: -1},
		{Name: "debian-12", State: "verified", Percent: 100, SizeBytes: 2 << 30, Digest: "sha256:7c1e0b4f9a2d3e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7"},
		{Name: "rocky-9", State: "failed", Percent: 0, Reason: "checksum mismatch: got sha256:1f2e…, want sha256:9a8b…"},
		ubuntu,
	}, nil
}

// fakeInventory is the reconciler's view: the acting revision retires
// three servers, which the brake holds until approved. Once the store
// records the approval, it re-plans with the steps released, as
// plan.Compute does with plan.Options.Approved.
type fakeInventory struct{ store *state.Store }

func (f *fakeInventory) InventoryStatus(context.Context) (ui.InventoryStatus, error) {
	acting := ui.Revision{Commit: "9e1f2a3b4c5d6e7f8091a2b3c4d5e6f708192a3b", Digest: HeldDigest,
		Message: "retire rack r3", At: time.Date(2026, 11, 29, 9, 30, 0, 0, time.UTC)}
	st := ui.InventoryStatus{
		Acting: acting,
		Newest: ui.Revision{Commit: "b7c8d9e0f1a2b3c4d5e6f708192a3b4c5d6e7f80", Message: "add r4 servers",
			At: time.Date(2026, 11, 29, 10, 5, 0, 0, time.UTC)},
		Errors: []ui.ValidationError{
			{File: "servers.yaml", Line: 88, Column: 14, Path: "servers[12].bootMAC", Message: `"52:54:00:04:00" is not a MAC address`},
			{File: "servers.yaml", Line: 95, Column: 11, Path: "servers[13].zone", Message: `zone "zone-d" has no profile`},
		},
		Git: &ui.GitHealth{
			Poll: ui.GitLoop{LastSuccess: time.Date(2026, 11, 29, 10, 6, 0, 0, time.UTC)},
			Push: ui.GitLoop{LastSuccess: time.Date(2026, 11, 29, 9, 40, 0, 0, time.UTC), ConsecutiveFailures: 4, Failing: true,
				LastError: "status write: push to the inventory remote: pre-receive hook declined"},
			RemoteTip: "b7c8d9e0f1a2b3c4d5e6f708192a3b4c5d6e7f80", LastStatusCommit: "c0ffee0123456789abcdef0123456789abcdef01", LastStatusPackBytes: 9060,
		},
		Conditions: []ui.Condition{
			{Subject: "server/r2-n02", Type: "Waiting", Reason: "Stalled", Message: "commissioning failed; bump actions.commission to retry"},
			{Subject: "profile/hypervisor", Type: "InsufficientCapacity", Reason: "NoReadyServer", Message: "count 4 wants 1 more ready server in zone-a"},
		},
	}
	ok, err := f.store.Approved(HeldDigest)
	if err != nil {
		return ui.InventoryStatus{}, err
	}
	if !ok {
		st.Held = []ui.PlanStep{
			{Server: "r3-n01", Action: "retire", Why: "want: retired"},
			{Server: "r3-n03", Action: "retire", Why: "want: retired"},
			{Server: "r1-n03", Action: "release", Why: "profile hypervisor count lowered to 0"},
		}
		st.Brake = "this revision would release or retire 3 of 9 servers (33%), more than the 20% brake"
		st.Conditions = append(st.Conditions, ui.Condition{Subject: "inventory", Type: "Held", Reason: "SafetyBrake", Message: st.Brake})
	}
	return st, nil
}
