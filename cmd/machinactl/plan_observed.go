package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"path"
	"sort"
	"strconv"
	"strings"
	"time"

	"sigs.k8s.io/yaml"

	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/state"
)

// maxStatusFileBytes bounds one status/servers/XX/NAME.yaml the plan reads
// (the writer's files are about 1 KiB; 1 MiB leaves room for long errors).
const maxStatusFileBytes = 1 << 20

// maxListPages bounds how many pages of GET /api/v1/servers the plan reads
// (1,000 per page: a million servers), so a misbehaving API cannot loop.
const maxListPages = 1000

// snapshotFromAPI reads every server from GET /api/v1/servers, page by page
// (1,000 a page), into a state.Snapshot for plan.Compute.
func snapshotFromAPI(ctx context.Context, c *v1.Client) (state.Snapshot, error) {
	snap := state.Snapshot{Servers: map[string]*state.Server{}, Hosts: map[string]state.Host{}}
	after := ""
	for range maxListPages {
		page, err := c.ListServers(ctx, v1.ListServersOptions{After: after, Limit: state.MaxPageSize})
		if err != nil {
			return state.Snapshot{}, fmt.Errorf("list servers: %w", err)
		}
		for _, s := range page.Servers {
			srv := fromWire(s)
			snap.Servers[s.Name] = &srv
		}
		if page.Next == "" {
			return snap, nil
		}
		if page.Next <= after {
			return state.Snapshot{}, fmt.Errorf("list servers: page cursor went backwards (%q after %q)", page.Next, after)
		}
		after = page.Next
	}
	return state.Snapshot{}, fmt.Errorf("list servers: more than %d pages", maxListPages)
}

// firmwareFromAPI adds, to each server of have that a profile with a
// firmware block applies to (allocated or deployed with it, or pinned to
// it in want), the controller's last firmware read (GET
// /api/v1/servers/{name}/firmware), so the plan lists what that block
// would change on it. A server whose firmware was never read keeps none
// (the plan then says FirmwareNotRead).
func firmwareFromAPI(ctx context.Context, c *v1.Client, want *inventory.Inventory, have state.Snapshot) error {
	for _, ws := range want.Servers {
		obs, ok := have.Servers[ws.Name]
		if !ok {
			continue
		}
		prof := ws.Profile
		if obs.Allocation != nil && obs.Allocation.Profile != "" {
			prof = obs.Allocation.Profile
		}
		if p := want.Profile(prof); p == nil || p.Firmware == nil {
			continue
		}
		var fw state.Firmware
		err := c.GetJSON(ctx, "/api/v1/servers/"+url.PathEscape(ws.Name)+"/firmware", &fw)
		var ae *v1.APIError
		if errors.As(err, &ae) && ae.StatusCode == http.StatusNotFound {
			continue
		}
		if err != nil {
			return fmt.Errorf("server %s: %w", ws.Name, err)
		}
		withFW := *obs // snapshot records are read-only: change a copy
		withFW.Firmware = &fw
		have.Servers[ws.Name] = &withFW
	}
	return nil
}

// fromWire maps the API's server to the observed record plan.Compute reads: identity,
// lifecycle, hardware, allocation, observed action counters, stall and
// finish-deploy flags.
func fromWire(s v1.Server) state.Server {
	out := state.Server{
		Name: s.Name, Zone: s.Zone, Site: s.Site, Rack: s.Rack, BootMAC: s.BootMAC, BootMode: s.BootMode,
		Lifecycle: state.Lifecycle(s.Lifecycle), LifecycleAt: s.LifecycleAt,
		Power: state.PowerStatus{State: state.Power(s.Power.State), Source: state.PowerSource(s.Power.Source), At: s.Power.At, OffClaimedAt: s.Power.OffClaimedAt},
		BMC: state.BMCFacts{Driver: s.BMC.Driver, Address: s.BMC.Address, Credentials: s.BMC.Credentials, SystemID: s.BMC.SystemID,
			InsecureTLS: s.BMC.InsecureTLS, Manufacturer: s.BMC.Manufacturer, Model: s.BMC.Model, SerialNumber: s.BMC.SerialNumber,
			FirmwareVersion: s.BMC.FirmwareVersion},
		Actions: s.Actions, LastError: s.LastError, Stalled: s.Stalled, FinishDeploy: s.FinishDeploy, Health: s.Health, BMCError: s.BMCError,
		Revision: s.Revision, CreatedAt: s.CreatedAt, UpdatedAt: s.UpdatedAt,
		Failures: s.Failures, RetryAt: s.RetryAt, LastHeard: s.LastHeard, LastHeardAt: s.LastHeardAt,
	}
	if s.InFlight != "" {
		out.InFlight = &state.InFlight{Action: s.InFlight}
	}
	if f := s.BootFetch; f != nil {
		out.BootFetch = &state.BootFetch{File: f.File, Via: f.Via, SecureBoot: f.SecureBoot, At: f.At}
	}
	if p := s.Progress; p != nil {
		out.Progress = &state.Progress{Step: p.Step, BytesDone: p.BytesDone, BytesTotal: p.BytesTotal, RateBytesPerSecond: p.RateBytesPerSecond, At: p.At, AdvancedAt: p.AdvancedAt}
	}
	if h := s.Hardware; h != nil {
		hw := &state.Hardware{Cores: h.Cores, MemoryBytes: h.MemoryBytes, Vendor: h.Vendor, Product: h.Product, Serial: h.Serial, ObservedAt: h.ObservedAt,
			CPUVendor: h.CPUVendor, Arch: h.Arch, SMBIOSArch: h.SMBIOSArch, InstalledMemoryBytes: h.InstalledMemoryBytes}
		for _, g := range h.GPUs {
			hw.GPUs = append(hw.GPUs, state.GPU{PCIAddress: g.PCIAddress, Vendor: g.Vendor, DeviceID: g.DeviceID})
		}
		for _, d := range h.Disks {
			hw.Disks = append(hw.Disks, state.Disk{Name: d.Name, SizeBytes: d.SizeBytes, Model: d.Model, Serial: d.Serial, Rotational: d.Rotational, Transport: d.Transport, WWN: d.WWN, ByPath: d.ByPath})
		}
		for _, n := range h.NICs {
			hw.NICs = append(hw.NICs, state.NIC{Name: n.Name, MAC: n.MAC, SpeedMbps: n.SpeedMbps, Link: n.Link, LLDP: lldpFromAPI(n.LLDP)})
		}
		out.Hardware = hw
	}
	if a := s.Allocation; a != nil {
		out.Allocation = &state.Allocation{Profile: a.Profile, Image: a.Image, At: a.At, Reason: a.Reason}
	}
	for _, l := range s.Addresses {
		out.Addresses = append(out.Addresses, state.AddressLease{Subnet: l.Subnet, Interface: l.Interface, Address: l.Address, Profile: l.Profile, At: l.At})
	}
	if e := s.Enrolled; e != nil {
		out.Enrolled = &state.Enrolment{At: e.At, Source: e.Source, Branch: e.Branch, Commit: e.Commit, ProposedAt: e.ProposedAt, ProposalError: e.ProposalError}
	}
	return out
}

// statusServer is status/servers/XX/NAME.yaml as reconciler's status writer
// renders it (gitops/status_render.go renderServer). Fields the plan
// does not need (events, NIC details) are still listed so the file
// decodes strictly and a format change is noticed.
type statusServer struct {
	Name       string `json:"name"`
	Lifecycle  string `json:"lifecycle"`
	Power      string `json:"power"`
	Health     string `json:"health"`
	Profile    string `json:"profile"`
	Allocation string `json:"allocation"`
	// Addresses are the pool addresses IPAM holds for the server: the
	// plan's simulation of IPAM counts them as held.
	Addresses []struct {
		Address   string `json:"address"`
		Interface string `json:"interface"`
		Subnet    string `json:"subnet"`
		Profile   string `json:"profile"`
	} `json:"addresses"`
	Hardware   *statusHardware `json:"hardware"`
	Conditions []struct {
		Type               string `json:"type"`
		Status             string `json:"status"`
		Reason             string `json:"reason"`
		Message            string `json:"message"`
		LastTransitionTime string `json:"lastTransitionTime"`
	} `json:"conditions"`
	ObservedActions map[string]int64 `json:"observedActions"`
	LastError       string           `json:"lastError"`
	Events          []struct {
		Time    *string `json:"time"`
		Type    string  `json:"type"`
		Reason  string  `json:"reason"`
		Message string  `json:"message"`
	} `json:"events"`
}

type statusHardware struct {
	Vendor string `json:"vendor"`
	Model  string `json:"model"`
	Serial string `json:"serial"`
	// Arch is the commissioning report's architecture (a GOARCH name),
	// which the plan's architecture guard reads.
	Arch string `json:"arch"`
	// SMBIOSArch is the architecture the firmware's SMBIOS tables state
	// (hardware.smbiosArch, a GOARCH name), which the guard weighs
	// against Arch (state.Hardware.MachineArch, ArchConflict).
	SMBIOSArch string `json:"smbiosArch"`
	CPUModel   string `json:"cpuModel"`
	Cores      int    `json:"cores"`
	MemoryGiB  int64  `json:"memoryGiB"`
	// Labels are the derived labels (status/servers/XX/NAME.yaml
	// hardware.labels), turned back into the facts they come from.
	Labels map[string]string `json:"labels"`
	Disks  []struct {
		Name    string `json:"name"`
		Model   string `json:"model"`
		Serial  string `json:"serial"`
		SizeGiB int64  `json:"sizeGiB"`
	} `json:"disks"`
	NICs []struct {
		Name      string `json:"name"`
		MAC       string `json:"mac"`
		SpeedMbps int    `json:"speedMbps"`
		// Switch and Port are what people read; LLDP holds the fields
		// the cabling check compares (gitops status_lldp.go).
		Switch string      `json:"switch"`
		Port   string      `json:"port"`
		LLDP   *state.LLDP `json:"lldp"`
	} `json:"nics"`
}

// parseStatusServer decodes one status/servers/XX/NAME.yaml strictly (unknown
// fields are errors) and maps it to an observed record. The status tree
// does not carry everything the store holds, so:
//   - memory and disk sizes are whole GiB (rounded down by the writer);
//   - LifecycleAt is now (the plan predicts no deadline timeouts) and
//     Allocation.At is zero (ties among count releases fall to the name);
//   - identity (zone, rack, boot MAC, BMC) is filled in by the caller.
func parseStatusServer(data []byte, now time.Time) (state.Server, error) {
	var ss statusServer
	if err := yaml.UnmarshalStrict(data, &ss); err != nil {
		return state.Server{}, err
	}
	if ss.Name == "" {
		return state.Server{}, errors.New("no name")
	}
	lc, err := state.ParseLifecycle(ss.Lifecycle)
	if err != nil {
		return state.Server{}, fmt.Errorf("server %s: %w", ss.Name, err)
	}
	out := state.Server{
		Name: ss.Name, Lifecycle: lc, LifecycleAt: now,
		Power:  state.PowerStatus{State: state.Power(ss.Power)},
		Health: ss.Health, LastError: ss.LastError,
	}
	for k, v := range ss.ObservedActions {
		if v < 0 {
			return state.Server{}, fmt.Errorf("server %s: observedActions.%s is negative", ss.Name, k)
		}
		if v != 0 {
			if out.Actions == nil {
				out.Actions = map[string]int64{}
			}
			out.Actions[k] = v
		}
	}
	if h := ss.Hardware; h != nil {
		if h.Cores < 0 || h.MemoryGiB < 0 || h.MemoryGiB > 1<<32 {
			return state.Server{}, fmt.Errorf("server %s: hardware sizes out of range", ss.Name)
		}
		hw := &state.Hardware{Cores: h.Cores, MemoryBytes: h.MemoryGiB << 30, Vendor: h.Vendor, Product: h.Model, Serial: h.Serial, Arch: h.Arch, SMBIOSArch: h.SMBIOSArch}
		for _, d := range h.Disks {
			if d.SizeGiB < 0 || d.SizeGiB > 1<<32 {
				return state.Server{}, fmt.Errorf("server %s: disk %s size out of range", ss.Name, d.Name)
			}
			hw.Disks = append(hw.Disks, state.Disk{Name: d.Name, SizeBytes: d.SizeGiB << 30, Model: d.Model, Serial: d.Serial})
		}
		for _, n := range h.NICs {
			hw.NICs = append(hw.NICs, state.NIC{Name: n.Name, MAC: n.MAC, SpeedMbps: n.SpeedMbps, LLDP: n.LLDP})
		}
		labelsToHardware(hw, h.Labels)
		out.Hardware = hw
	}
	if ss.Profile != "" {
		out.Allocation = &state.Allocation{Profile: ss.Profile, Reason: ss.Allocation}
	}
	for _, a := range ss.Addresses {
		out.Addresses = append(out.Addresses, state.AddressLease{Subnet: a.Subnet, Interface: a.Interface, Address: a.Address, Profile: a.Profile})
	}
	for _, c := range ss.Conditions {
		if c.Type == "Stalled" && c.Status == "True" {
			out.Stalled = "stalled" // the action key is not in status; any non-empty value means stalled
		}
	}
	return out, nil
}

// snapshotFromStatus reads the status tree under dir of fsys (the folder
// holding servers/, i.e. "status" of a repository) into a snapshot.
// identity, when non-nil, supplies each server's zone, site, rack, boot MAC,
// boot mode and BMC settings (status files do not carry them): pass the
// inventory the controller acts on, so the plan shows identity changes of
// the planned revision against it.
func snapshotFromStatus(fsys fs.FS, dir string, identity *inventory.Inventory, now time.Time) (state.Snapshot, error) {
	snap := state.Snapshot{Servers: map[string]*state.Server{}, Hosts: map[string]state.Host{}}
	sdir := path.Join(dir, "servers")
	files, err := statusServerFiles(fsys, sdir)
	if err != nil {
		return state.Snapshot{}, err
	}
	for _, n := range files {
		data, err := readCapped(fsys, n, maxStatusFileBytes)
		if err != nil {
			return state.Snapshot{}, fmt.Errorf("read status %s: %w", n, err)
		}
		srv, err := parseStatusServer(data, now)
		if err != nil {
			return state.Snapshot{}, fmt.Errorf("parse status %s: %w", n, err)
		}
		if srv.Name+".yaml" != path.Base(n) {
			return state.Snapshot{}, fmt.Errorf("parse status %s: names server %q", n, srv.Name)
		}
		if _, dup := snap.Servers[srv.Name]; dup {
			return state.Snapshot{}, fmt.Errorf("parse status %s: server %q has more than one status file", n, srv.Name)
		}
		if identity != nil {
			if ws := identity.Server(srv.Name); ws != nil {
				srv.Zone, srv.Site, srv.Rack, srv.BootMAC, srv.BootMode = ws.Zone, ws.Site, ws.Rack, ws.BootMAC, string(ws.BootMode)
				srv.BMC = state.BMCFacts{Driver: string(ws.BMC.Driver), Address: ws.BMC.Address, Credentials: ws.BMC.Credentials,
					SystemID: ws.BMC.SystemID, InsecureTLS: ws.BMC.InsecureTLS}
			}
		}
		snap.Servers[srv.Name] = &srv
	}
	return snap, nil
}

// statusServerFiles lists the server status files under sdir, sorted:
// the fan-out layout the controller writes (sdir/XX/NAME.yaml, see
// gitops.ServerStatusPath) and the flat one older controllers wrote
// (sdir/NAME.yaml), so a plan reads either side of the migration.
func statusServerFiles(fsys fs.FS, sdir string) ([]string, error) {
	entries, err := fs.ReadDir(fsys, sdir)
	if err != nil {
		return nil, fmt.Errorf("read status tree %s: %w", sdir, err)
	}
	var files []string
	for _, e := range entries {
		switch {
		case e.IsDir():
			sub := path.Join(sdir, e.Name())
			inner, err := fs.ReadDir(fsys, sub)
			if err != nil {
				return nil, fmt.Errorf("read status tree %s: %w", sub, err)
			}
			for _, f := range inner {
				if !f.IsDir() && strings.HasSuffix(f.Name(), ".yaml") {
					files = append(files, path.Join(sub, f.Name()))
				}
			}
		case strings.HasSuffix(e.Name(), ".yaml"):
			files = append(files, path.Join(sdir, e.Name()))
		}
	}
	sort.Strings(files)
	return files, nil
}

// readCapped reads name from fsys, refusing files over limit bytes.
func readCapped(fsys fs.FS, name string, limit int64) ([]byte, error) {
	f, err := fsys.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("larger than %d bytes", limit)
	}
	return data, nil
}

// labelsToHardware sets the facts of hw that give the derived labels l
// (status files carry the labels, not the report): the same labels come
// out of hw.Labels() again.
func labelsToHardware(hw *state.Hardware, l map[string]string) {
	switch v := l[state.LabelCPUVendor]; v {
	case "intel":
		hw.CPUVendor = "GenuineIntel"
	case "amd":
		hw.CPUVendor = "AuthenticAMD"
	default:
		hw.CPUVendor = v
	}
	if hw.Arch == "" { // hardware.arch, when the status file has it, is the report's own
		hw.Arch = l[state.LabelCPUArch]
	}
	if g, err := strconv.ParseInt(l[state.LabelMemoryGiB], 10, 64); err == nil && g > 0 && g < 1<<32 {
		hw.InstalledMemoryBytes = g << 30
	}
	if v := l[state.LabelGPUVendor]; v != "" {
		hw.GPUs = []state.GPU{{Vendor: v}}
	}
	if n, err := strconv.Atoi(l[state.LabelDiskNVMeCount]); err == nil {
		for i := range hw.Disks {
			if i < n {
				hw.Disks[i].Transport = "nvme"
			} else {
				hw.Disks[i].Transport = "other"
			}
		}
	}
	if s, err := strconv.Atoi(l[state.LabelNICSpeedMax]); err == nil && s > 0 {
		top := 0
		for _, n := range hw.NICs {
			top = max(top, n.SpeedMbps)
		}
		if top < s {
			hw.NICs = append(hw.NICs, state.NIC{Name: "(from labels)", SpeedMbps: s})
		}
	}
}
