package api

import (
	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/state"
)

// lldpToState keeps a NIC's LLDP finding of a commissioning report in the
// store (VLAN names are not kept: status and the cabling check read IDs).
func lldpToState(l *v1.LLDP) *state.LLDP {
	if l == nil {
		return nil
	}
	out := &state.LLDP{ChassisID: l.ChassisID, SystemName: l.SystemName, PortID: l.PortID, PortIDSubtype: l.PortIDSubtype,
		PortDescription: l.PortDescription, PortVLAN: l.PortVLAN, MaxFrameSize: l.MaxFrameSize}
	for _, v := range l.VLANs {
		out.VLANs = append(out.VLANs, v.ID)
	}
	return out
}

// lldpToV1 is the API's view of a stored LLDP finding.
func lldpToV1(l *state.LLDP) *v1.LLDP {
	if l == nil {
		return nil
	}
	out := &v1.LLDP{ChassisID: l.ChassisID, SystemName: l.SystemName, PortID: l.PortID, PortIDSubtype: l.PortIDSubtype,
		PortDescription: l.PortDescription, PortVLAN: l.PortVLAN, MaxFrameSize: l.MaxFrameSize}
	for _, id := range l.VLANs {
		out.VLANs = append(out.VLANs, v1.LLDPVLAN{ID: id})
	}
	return out
}
