package inventory

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/machina-metal/machina/macaddr"
)

// ServerNIC is one entry of a server's nics (servers.yaml): a NIC, named
// by MAC (normalised to lower-case colon form) or by its kernel name in the
// commissioning report, and the switch port it must be cabled to.
type ServerNIC struct {
	MAC    string        `json:"mac,omitempty"`
	Name   string        `json:"name,omitempty"`
	Expect CablingExpect `json:"expect"`
}

// CablingExpect is the switch port a NIC must be cabled to, as LLDP names
// it: Switch is the switch's system name or chassis ID, Port its port ID or
// port description; both are compared ignoring case
// (state.LLDP.Matches).
type CablingExpect struct {
	Switch string `json:"switch"`
	Port   string `json:"port"`
}

// String names the NIC as servers.yaml does: its MAC, else its name.
func (n ServerNIC) String() string {
	if n.MAC != "" {
		return n.MAC
	}
	return n.Name
}

// normaliseNICs puts s's NIC MACs in lower-case colon form.
func normaliseNICs(s *Server) {
	for i := range s.NICs {
		if m, err := macaddr.Normalize(strings.TrimSpace(s.NICs[i].MAC)); err == nil {
			s.NICs[i].MAC = m
		}
	}
}

// serverNICs checks servers[i].nics: each names a NIC once (by MAC or by
// name), and no two NICs expect the same switch port.
func (c *crossChecker) serverNICs(base string, s Server) {
	seen, ports := map[string]int{}, map[string]int{}
	for j, n := range s.NICs {
		at := base + "/nics/" + strconv.Itoa(j)
		if n.MAC != "" && n.Name != "" {
			c.errAt(c.sd, at+"/name", SeverityError, "name a NIC by mac or by name, not both")
		}
		if k, dup := seen[n.String()]; dup {
			c.errAt(c.sd, at, SeverityError, fmt.Sprintf("NIC %s is also nics[%d]", n, k))
		} else {
			seen[n.String()] = j
		}
		port := strings.ToLower(n.Expect.Switch) + "\x00" + strings.ToLower(n.Expect.Port)
		if k, dup := ports[port]; dup {
			c.errAt(c.sd, at+"/expect", SeverityError, fmt.Sprintf("switch %s port %s is also expected for nics[%d]: one cable per port", n.Expect.Switch, n.Expect.Port, k))
		} else {
			ports[port] = j
		}
	}
}
