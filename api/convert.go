package api

import (
	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/state"
)

// toServer maps a state record to its wire form. BMC.Credentials is the
// secret's name only.
func toServer(s state.Server) v1.Server {
	out := v1.Server{
		Name: s.Name, Zone: s.Zone, Site: s.Site, Rack: s.Rack, BootMAC: s.BootMAC, BootMode: s.BootMode,
		Lifecycle: string(s.Lifecycle), LifecycleAt: s.LifecycleAt,
		Power: v1.PowerStatus{State: string(s.Power.State), Source: string(s.Power.Source), At: s.Power.At, OffClaimedAt: s.Power.OffClaimedAt},
		BMC: v1.BMC{Driver: s.BMC.Driver, Address: s.BMC.Address, Credentials: s.BMC.Credentials,
			SystemID: s.BMC.SystemID, InsecureTLS: s.BMC.InsecureTLS,
			Manufacturer: s.BMC.Manufacturer, Model: s.BMC.Model, SerialNumber: s.BMC.SerialNumber, FirmwareVersion: s.BMC.FirmwareVersion},
		Actions: s.Actions, LastError: s.LastError, Revision: s.Revision, CreatedAt: s.CreatedAt, UpdatedAt: s.UpdatedAt,
		Health: s.Health, BMCError: s.BMCError, Stalled: s.Stalled, FinishDeploy: s.FinishDeploy, NeedsWipe: s.NeedsWipe,
		Failures: s.Failures, RetryAt: s.RetryAt, LastHeard: s.LastHeard, LastHeardAt: s.LastHeardAt,
	}
	if s.InFlight != nil {
		out.InFlight = s.InFlight.Action
	}
	if f := s.BootFetch; f != nil {
		out.BootFetch = &v1.BootFetch{File: f.File, Via: f.Via, SecureBoot: f.SecureBoot, At: f.At}
	}
	for _, e := range s.LastErase {
		out.LastErase = append(out.LastErase, v1.DiskErase{Disk: e.Disk, Name: e.Name, Method: e.Method, Bytes: e.Bytes, Duration: e.Duration, VerifiedSamples: e.VerifiedSamples})
	}
	if p := s.CurrentProgress(); p != nil {
		out.Progress = &v1.ServerProgress{Progress: v1.Progress{Step: p.Step, BytesDone: p.BytesDone, BytesTotal: p.BytesTotal, RateBytesPerSecond: p.RateBytesPerSecond, Retry: p.Retry},
			At: p.At, AdvancedAt: p.AdvancedAt}
	}
	if h := s.Hardware; h != nil {
		hw := &v1.Hardware{Cores: h.Cores, MemoryBytes: h.MemoryBytes, Vendor: h.Vendor, Product: h.Product, Serial: h.Serial, ObservedAt: h.ObservedAt,
			CPUVendor: h.CPUVendor, Arch: h.Arch, SMBIOSArch: h.SMBIOSArch, InstalledMemoryBytes: h.InstalledMemoryBytes, Labels: h.Labels()}
		for _, g := range h.GPUs {
			hw.GPUs = append(hw.GPUs, v1.GPU{PCIAddress: g.PCIAddress, Vendor: g.Vendor, DeviceID: g.DeviceID})
		}
		for _, d := range h.Disks {
			hw.Disks = append(hw.Disks, v1.Disk{Name: d.Name, SizeBytes: d.SizeBytes, Model: d.Model, Serial: d.Serial, Rotational: d.Rotational, Transport: d.Transport, WWN: d.WWN, ByPath: d.ByPath})
		}
		for _, n := range h.NICs {
			hw.NICs = append(hw.NICs, v1.NIC{Name: n.Name, MAC: n.MAC, SpeedMbps: n.SpeedMbps, Link: n.Link, LLDP: lldpToV1(n.LLDP)})
		}
		out.Hardware = hw
	}
	if a := s.Allocation; a != nil {
		out.Allocation = &v1.Allocation{Profile: a.Profile, Image: a.Image, At: a.At, Reason: a.Reason}
	}
	for _, l := range s.Addresses {
		out.Addresses = append(out.Addresses, v1.AddressLease{Subnet: l.Subnet, Interface: l.Interface, Address: l.Address, Profile: l.Profile, At: l.At})
	}
	if e := s.Enrolled; e != nil {
		out.Enrolled = &v1.Enrolment{At: e.At, Source: e.Source, Branch: e.Branch, Commit: e.Commit, ProposedAt: e.ProposedAt, ProposalError: e.ProposalError}
	}
	return out
}

func toEvent(e state.Event) v1.Event {
	return v1.Event{Seq: e.Seq, At: e.At, Server: e.Server, Kind: string(e.Kind), Actor: e.Actor, Role: string(e.Role),
		From: string(e.From), To: string(e.To), Power: string(e.Power), Message: e.Message}
}

func toEventList(evs []state.Event, limit int) v1.EventList {
	out := v1.EventList{Events: make([]v1.Event, 0, len(evs))}
	for _, e := range evs {
		out.Events = append(out.Events, toEvent(e))
	}
	if len(evs) == limit && limit > 0 {
		out.Next = evs[len(evs)-1].Seq
	}
	return out
}

func toSecret(i state.SecretInfo) v1.Secret {
	return v1.Secret{Name: i.Name, Sealed: i.Sealed, UpdatedAt: i.UpdatedAt, UpdatedBy: i.UpdatedBy}
}
