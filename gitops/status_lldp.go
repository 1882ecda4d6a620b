package gitops

import (
	"strconv"

	"github.com/machina-metal/machina/state"
)

// lldp writes, under a status file's NIC, the switch and port it heard at
// commissioning (state.LLDP.Switch and Port, what people read) and an lldp
// block with the fields the cabling check compares (machinactl reads the
// block back for an offline plan); nothing for nil.
func (w *yamlWriter) lldp(l *state.LLDP) {
	if l == nil {
		return
	}
	w.text(2, "switch", l.Switch())
	w.text(2, "port", l.Port())
	w.key(2, "lldp")
	w.text(3, "chassisID", orUnknown(l.ChassisID))
	w.text(3, "systemName", l.SystemName)
	w.text(3, "portID", orUnknown(l.PortID))
	w.str(3, "portIDSubtype", l.PortIDSubtype)
	w.text(3, "portDescription", l.PortDescription)
	w.int(3, "portVLAN", int64(l.PortVLAN), false)
	if len(l.VLANs) > 0 {
		w.key(3, "vlans")
		for _, v := range l.VLANs {
			w.item(3)
			w.b.WriteString(strconv.Itoa(v))
			w.b.WriteByte('\n')
		}
	}
	w.int(3, "maxFrameSize", int64(l.MaxFrameSize), false)
}
