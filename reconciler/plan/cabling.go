package plan

import (
	"fmt"
	"strings"

	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/state"
)

// CondCablingMismatch is the condition of a server whose NIC, at its last
// commissioning, heard another switch port over LLDP than servers.yaml nics
// expect, or none at all. Its reason is ReasonCablingDiffers when some NIC
// heard another port, ReasonCablingNotSeen when the NICs in question heard
// nothing (or are not in the report).
const (
	CondCablingMismatch  = "CablingMismatch"
	ReasonCablingDiffers = "SwitchPortDiffers"
	ReasonCablingNotSeen = "NoLLDPSeen"
)

// cablingMismatches returns one line per NIC of ws.NICs whose commissioning
// report did not show its expected switch port (state.LLDP.Matches),
// naming the NIC, what was expected and what was seen, and whether any
// NIC heard another port. Nothing before a commissioning report (obs nil or
// without hardware): nothing was seen yet. It allocates only for a
// mismatch.
func cablingMismatches(ws *inventory.Server, obs *state.Server) (lines []string, differs bool) {
	if len(ws.NICs) == 0 || obs == nil || obs.Hardware == nil {
		return nil, false
	}
	for _, want := range ws.NICs {
		var nic *state.NIC
		for i := range obs.Hardware.NICs {
			n := &obs.Hardware.NICs[i]
			if (want.MAC != "" && strings.EqualFold(n.MAC, want.MAC)) || (want.MAC == "" && n.Name == want.Name) {
				nic = n
				break
			}
		}
		exp := fmt.Sprintf("expected switch %s port %s", want.Expect.Switch, want.Expect.Port)
		id := want.String()
		if nic != nil && want.MAC != "" {
			id += " (" + nic.Name + ")"
		}
		switch {
		case nic == nil:
			lines = append(lines, fmt.Sprintf("NIC %s: %s, but the commissioning report has no such NIC", want, exp))
		case nic.LLDP == nil:
			lines = append(lines, fmt.Sprintf("NIC %s: %s, saw no LLDP frame", id, exp))
		case !nic.LLDP.Matches(want.Expect.Switch, want.Expect.Port):
			differs = true
			lines = append(lines, fmt.Sprintf("NIC %s: %s, saw switch %s port %s", id, exp, nic.LLDP.Switch(), nic.LLDP.Port()))
		}
	}
	return lines, differs
}

// cablingBlocked reports whether a server is held from allocation by a
// CablingMismatch. obs may be nil.
func cablingBlocked(ws *inventory.Server, obs *state.Server) bool {
	lines, _ := cablingMismatches(ws, obs)
	return len(lines) > 0
}

// cablingConditions guards allocation and deploy: a server whose NICs did
// not hear their expected switch ports at commissioning gets one
// CablingMismatch condition (every such NIC in its message) and no
// allocate or deploy step (a pinned server is deployed without a separate
// allocate; an image on a miscabled host joins the wrong networks), until
// a recommission sees the expected ports or servers.yaml's expectation
// changes. It returns the conditions and the steps kept.
func cablingConditions(ws *inventory.Server, obs *state.Server, steps []Step) ([]Condition, []Step) {
	lines, differs := cablingMismatches(ws, obs)
	if len(lines) == 0 {
		return nil, steps
	}
	reason := ReasonCablingNotSeen
	if differs {
		reason = ReasonCablingDiffers
	}
	c := Condition{Subject: "server/" + ws.Name, Type: CondCablingMismatch, Reason: reason,
		Message: strings.Join(lines, "; ") + ": not allocated or deployed until a recommission sees the expected ports or servers.yaml nics change"}
	kept := steps[:0:0]
	for _, s := range steps {
		if s.Action != ActAllocate && s.Action != ActDeploy {
			kept = append(kept, s)
		}
	}
	return []Condition{c}, kept
}
