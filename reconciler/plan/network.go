package plan

import (
	"errors"
	"fmt"
	"strings"

	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/state"
)

// CondNetworkLayoutUnsupported: the server cannot carry its profile's
// network layout, so it is not deployed with it (a host brought up on
// half its networks is worse than none). Reason NICsMissing (the
// commissioning report lacks NICs an ethernet of the layout matches; the
// message names each) or AddressMissing (an interface in fixed mode has
// no address for this server in servers.yaml network.addresses).
const CondNetworkLayoutUnsupported = "NetworkLayoutUnsupported"

// CheckNetwork checks that server ws, as commissioning found it (obs),
// can carry profile prof's network layout: every ethernet matches a NIC of
// the report and every fixed-mode interface has its address. It returns
// the refusals, nil when the profile has no layout or the server was
// never commissioned (allocation waits for commissioning anyway). Pool
// addresses are IPAM's and are not checked here. Pure.
func CheckNetwork(prof *inventory.Profile, ws *inventory.Server, obs *state.Server) []Condition {
	if prof == nil || prof.Network == nil || obs == nil || obs.Hardware == nil {
		return nil
	}
	subject := "server/" + ws.Name
	var out []Condition
	nics := make([]inventory.NIC, 0, len(obs.Hardware.NICs))
	for _, n := range obs.Hardware.NICs {
		nics = append(nics, inventory.NIC{Name: n.Name, MAC: n.MAC, Driver: n.Driver, PCIAddress: n.PCIAddress, SpeedMbps: n.SpeedMbps})
	}
	if _, err := inventory.MatchNICs(prof.Network, ws.Network, nics); err != nil {
		var miss *inventory.MissingNICsError
		msg := err.Error()
		if errors.As(err, &miss) {
			msg = "the network layout needs NICs commissioning did not find: " + strings.Join(miss.Missing, "; ")
		}
		out = append(out, Condition{Subject: subject, Type: CondNetworkLayoutUnsupported, Reason: "NICsMissing",
			Message: "profile " + prof.Name + ": " + msg + "; not deployed with this profile"})
	}
	var missing []string
	for _, li := range prof.Network.Interfaces() {
		if li.Address == inventory.AddressFixed && (ws.Network == nil || len(ws.Network.Addresses[li.Name]) == 0) {
			missing = append(missing, li.Name)
		}
	}
	if len(missing) > 0 {
		out = append(out, Condition{Subject: subject, Type: CondNetworkLayoutUnsupported, Reason: "AddressMissing",
			Message: fmt.Sprintf("profile %s: interface %s is address: fixed and servers.yaml gives this server no address for it (network.addresses); not deployed with this profile", prof.Name, strings.Join(missing, ", "))})
	}
	return out
}

// networkRefused reports whether server ws cannot carry profile pr's
// network layout (Candidates skips it).
func networkRefused(pr *inventory.Profile, ws *inventory.Server, obs *state.Server) bool {
	return pr.Network != nil && len(CheckNetwork(pr, ws, obs)) > 0
}

// networkNote says, for a profile short of servers, how many ready
// servers of its zone its network layout refused, and why the first was.
func networkNote(p inventory.Profile, want *inventory.Inventory, have state.Snapshot) string {
	if p.Network == nil {
		return ""
	}
	n, first := 0, ""
	for i := range want.Servers {
		ws := &want.Servers[i]
		if ws.Want == inventory.WantRetired || (p.Zone != "" && ws.Zone != p.Zone) || (ws.Profile != "" && ws.Profile != p.Name) {
			continue
		}
		obs, ok := have.Servers[ws.Name]
		if !ok || obs.Lifecycle != state.LifecycleReady {
			continue
		}
		if c := CheckNetwork(&p, ws, obs); len(c) > 0 {
			if n == 0 {
				first = ws.Name + ": " + strings.TrimPrefix(c[0].Message, "profile "+p.Name+": ")
			}
			n++
		}
	}
	if n == 0 {
		return ""
	}
	return fmt.Sprintf("; %d ready servers cannot carry the network layout (first, %s)", n, first)
}

// networks raises CondNetworkLayoutUnsupported on every server a profile
// with a network layout applies to (pinned to it, allocated to it, or
// allocated to it in this plan) that is not deployed yet and cannot carry
// the layout, and drops its deploy step: the server stays allocated,
// never half-configured, until the inventory or its hardware changes.
func (p *planning) networks() {
	if !anyProfile(p.want, func(pr *inventory.Profile) bool { return pr.Network != nil }) {
		return // every server below would be skipped: no profile has a network layout
	}
	blocked := map[string]Condition{}
	for i := range p.want.Servers {
		ws := &p.want.Servers[i]
		if ws.Want == inventory.WantRetired {
			continue
		}
		obs, ok := p.have.Servers[ws.Name]
		if !ok {
			continue
		}
		switch obs.Lifecycle {
		case state.LifecycleReady, state.LifecycleAllocated:
		default:
			continue // deploying or deployed: the layout was checked before the plan was served
		}
		name := firmwareProfile(ws, obs)
		if planned, ok := p.allocated[ws.Name]; ok {
			name = planned
		}
		prof := p.want.Profile(name)
		if prof == nil || prof.Network == nil {
			continue
		}
		for _, c := range CheckNetwork(prof, ws, obs) {
			p.cond(c)
			blocked[ws.Name] = c
		}
	}
	if len(blocked) > 0 {
		p.res.Steps = dropDeploys(p.res.Steps, blocked)
		p.disruptive = dropDeploys(p.disruptive, blocked)
	}
}
