package v1

import (
	"errors"
	"fmt"
)

// LLDP is what one NIC heard from its link partner during commissioning:
// the fields of the first LLDPDU (IEEE 802.1AB-2016 §8.5) the ramdisk
// received on that NIC, sent to the nearest-bridge address
// 01:80:c2:00:00:0e (ethertype 88cch). A NIC that heard none has no LLDP.
type LLDP struct {
	// ChassisID is the Chassis ID TLV (§8.5.2): a MAC in lower-case colon
	// form when ChassisIDSubtype is "mac", an address when "network",
	// otherwise the TLV's text.
	ChassisID string `json:"chassisID"`
	// ChassisIDSubtype names the TLV's subtype (Table 8-2): "chassis",
	// "ifalias", "port", "mac", "network", "ifname" or "local".
	ChassisIDSubtype string `json:"chassisIDSubtype,omitempty"`
	// SystemName is the System Name TLV (§8.5.6); switches send their host name.
	SystemName string `json:"systemName,omitempty"`
	// PortID is the Port ID TLV (§8.5.3), rendered like ChassisID.
	PortID string `json:"portID"`
	// PortIDSubtype names its subtype (Table 8-3): "ifalias", "port", "mac",
	// "network", "ifname", "circuit" or "local".
	PortIDSubtype string `json:"portIDSubtype,omitempty"`
	// PortDescription is the Port Description TLV (§8.5.5).
	PortDescription string `json:"portDescription,omitempty"`
	// PortVLAN is the 802.1 Port VLAN ID TLV (IEEE 802.1Q-2018 Annex
	// D.2.1): the VLAN untagged frames land in; 0 when not sent.
	PortVLAN int `json:"portVLAN,omitempty"`
	// VLANs are the 802.1 VLAN Name TLVs (802.1Q Annex D.2.3): the VLANs
	// the port carries, with the switch's names for them.
	VLANs []LLDPVLAN `json:"vlans,omitempty"`
	// MaxFrameSize is the 802.3 Maximum Frame Size TLV (IEEE 802.3-2018
	// §79.3.4) in bytes, Ethernet header and FCS included (1518 for a
	// 1500-byte MTU untagged, 1522 tagged); 0 when not sent.
	MaxFrameSize int `json:"maxFrameSize,omitempty"`
}

// LLDPVLAN is one 802.1 VLAN Name TLV: a VLAN ID (1-4094) and its name.
type LLDPVLAN struct {
	ID   int    `json:"id"`
	Name string `json:"name,omitempty"`
}

// Switch names the link partner: its SystemName, else its ChassisID.
func (l *LLDP) Switch() string {
	if l == nil {
		return ""
	}
	if l.SystemName != "" {
		return l.SystemName
	}
	return l.ChassisID
}

// Port names the partner's port: the PortID, except that a port ID which
// is a MAC address (lldpd's default, and many servers') gives way to the
// PortDescription, which then carries the interface name.
func (l *LLDP) Port() string {
	if l == nil {
		return ""
	}
	if l.PortIDSubtype == "mac" && l.PortDescription != "" {
		return l.PortDescription
	}
	return l.PortID
}

// ErrLLDP is wrapped by LLDP.Validate.
var ErrLLDP = errors.New("invalid lldp")

// Validate checks what an LLDPDU can hold: each text at most 255 bytes
// (the TLVs' string limits, §8.5), at most 4094 VLANs with IDs 1-4094 and
// names of at most 32 bytes (802.1Q Annex D.2.3), a port VLAN 0-4094 and a
// frame size 0-65535. The controller refuses a report that fails it.
func (l *LLDP) Validate() error {
	if l == nil {
		return nil
	}
	for name, s := range map[string]string{"chassisID": l.ChassisID, "chassisIDSubtype": l.ChassisIDSubtype, "systemName": l.SystemName, "portID": l.PortID, "portIDSubtype": l.PortIDSubtype, "portDescription": l.PortDescription} {
		if len(s) > 255 {
			return fmt.Errorf("%w: %s longer than 255 bytes", ErrLLDP, name)
		}
	}
	if l.PortVLAN < 0 || l.PortVLAN > 4094 || l.MaxFrameSize < 0 || l.MaxFrameSize > 65535 || len(l.VLANs) > 4094 {
		return fmt.Errorf("%w: portVLAN %d, maxFrameSize %d or %d VLANs out of range", ErrLLDP, l.PortVLAN, l.MaxFrameSize, len(l.VLANs))
	}
	for _, v := range l.VLANs {
		if v.ID < 1 || v.ID > 4094 || len(v.Name) > 32 {
			return fmt.Errorf("%w: vlan %d %q out of range", ErrLLDP, v.ID, v.Name)
		}
	}
	return nil
}
