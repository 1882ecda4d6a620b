package state

import "strings"

// LLDP is what a NIC heard from its switch port at commissioning: the
// fields of the first LLDPDU (IEEE 802.1AB-2016 §8.5) the ramdisk received
// on it (api/v1.LLDP of the report, in the store's own type).
type LLDP struct {
	// ChassisID is the Chassis ID TLV: a MAC in lower-case colon form, an
	// address, or text.
	ChassisID string `json:"chassisID"`
	// SystemName is the System Name TLV (the switch's host name).
	SystemName string `json:"systemName,omitempty"`
	// PortID is the Port ID TLV; PortIDSubtype its subtype ("ifname",
	// "local", "mac", ...).
	PortID        string `json:"portID"`
	PortIDSubtype string `json:"portIDSubtype,omitempty"`
	// PortDescription is the Port Description TLV.
	PortDescription string `json:"portDescription,omitempty"`
	// PortVLAN is the 802.1 Port VLAN ID; 0 when not sent.
	PortVLAN int `json:"portVLAN,omitempty"`
	// VLANs are the VLAN IDs of the 802.1 VLAN Name TLVs.
	VLANs []int `json:"vlans,omitempty"`
	// MaxFrameSize is the 802.3 Maximum Frame Size in bytes; 0 when not sent.
	MaxFrameSize int `json:"maxFrameSize,omitempty"`
}

// Switch names the link partner as people read it: SystemName, else
// ChassisID; "" for nil.
func (l *LLDP) Switch() string {
	if l == nil {
		return ""
	}
	if l.SystemName != "" {
		return l.SystemName
	}
	return l.ChassisID
}

// Port names the partner's port: PortID, except that a port ID which is a
// MAC (lldpd's default) gives way to PortDescription, which then holds
// the interface name; "" for nil.
func (l *LLDP) Port() string {
	if l == nil {
		return ""
	}
	if l.PortIDSubtype == "mac" && l.PortDescription != "" {
		return l.PortDescription
	}
	return l.PortID
}

// Matches reports whether the partner is switch sw, port port: sw equals
// SystemName or ChassisID, port equals PortID or PortDescription, ignoring
// case (switch OSes print interface names in either case). Nil (no frame
// heard) matches nothing.
func (l *LLDP) Matches(sw, port string) bool {
	if l == nil {
		return false
	}
	eq := func(a, b string) bool { return b != "" && strings.EqualFold(a, b) }
	return (eq(sw, l.SystemName) || eq(sw, l.ChassisID)) && (eq(port, l.PortID) || eq(port, l.PortDescription))
}
