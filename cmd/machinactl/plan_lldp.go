package main

import (
	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/state"
)

// lldpFromAPI is a NIC's LLDP finding as the admin API serves it, in the
// store's type the plan reads (VLAN names dropped, as the store does).
func lldpFromAPI(l *v1.LLDP) *state.LLDP {
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
