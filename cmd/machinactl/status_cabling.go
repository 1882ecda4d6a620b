package main

import (
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/machina-metal/machina/state"
)

// writeCabling lists each commissioned NIC's switch and port as LLDP told
// commissioning (state.NIC.LLDP), one line a NIC, servers by name, at most
// maxAttentionLines lines; NICs that heard nothing are counted. Nothing
// when no server was commissioned with a NIC. Switch and port strings come
// off the wire and are made terminal-safe.
func writeCabling(w io.Writer, snap state.Snapshot) {
	var lines []string
	heard, silent := 0, 0
	for _, name := range sortedNames(snap.Servers) {
		hw := snap.Servers[name].Hardware
		if hw == nil {
			continue
		}
		nics := slices.Clone(hw.NICs)
		slices.SortFunc(nics, func(a, b state.NIC) int { return strings.Compare(a.Name, b.Name) })
		for _, n := range nics {
			if n.LLDP == nil {
				silent++
				continue
			}
			heard++
			l := fmt.Sprintf("  %-16s %-8s %s port %s", termSafe(name), termSafe(n.Name), termSafe(n.LLDP.Switch()), termSafe(n.LLDP.Port()))
			if n.LLDP.PortVLAN != 0 {
				l += fmt.Sprintf(" (port VLAN %d)", n.LLDP.PortVLAN)
			}
			lines = append(lines, l)
		}
	}
	if heard+silent == 0 {
		return
	}
	fmt.Fprintf(w, "Cabling:    %d NICs heard their switch (LLDP at commissioning), %d heard nothing\n", heard, silent)
	for i, l := range lines {
		if i == maxAttentionLines {
			fmt.Fprintf(w, "  ... %d more: status/servers/*.yaml hardware.nics\n", len(lines)-maxAttentionLines)
			break
		}
		fmt.Fprintln(w, l)
	}
}
