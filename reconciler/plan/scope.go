package plan

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/state"
)

// CondZoneClaimConflict is the Condition type (and reason) of a server
// whose zone two controller groups claim (machina serve --group/--zones,
// docs/ha.md "Sharding"): neither group plans it until one of them drops
// the zone, so two leaders never act on one server.
const CondZoneClaimConflict = "ZoneClaimConflict"

// CondProfileOutOfScope is the Condition type of a profile a controller
// group does not plan: its zone is not one of the group's, or it has no
// zone (a zone-less profile would be counted once per group). Reported
// only for a zone-less profile, the one an operator may expect planned.
const CondProfileOutOfScope = "ProfileOutOfScope"

// CondZoneHasNoServers is the Condition type (subject "inventory") of
// a zone a controller group claims that no server of servers.yaml is in:
// a warning (a typo in --zones, or a zone not racked yet), not an error.
const CondZoneHasNoServers = "ZoneHasNoServers"

// Scope limits a controller group's plan to part of the one inventory
// repository (docs/ha.md "Sharding"): the servers whose zone is one of
// Zones (by servers.yaml, or by the record for a server servers.yaml no
// longer names), the profiles whose zone is one of Zones, and the profiles
// the group's servers are pinned to.
type Scope struct {
	// Group is this controller group's name (an RFC 1123 label).
	Group string
	// Zones are the zones the group claims, each an RFC 1123 label.
	Zones []string
}

// Apply restricts want and have to s given every group's recorded claims
// (group → zones; s's own entry, if any, is replaced by s.Zones). A server
// in one of s's zones that another group claims too is in neither
// restricted view: it gets a CondZoneClaimConflict condition naming both
// groups (the other group's plan gets the same one), so no two leaders act
// on it. want may be nil (no valid revision yet): only have is restricted.
// The inputs are not modified; Digest is kept (approvals name the whole
// revision).
func (s Scope) Apply(claims map[string][]string, want *inventory.Inventory, have state.Snapshot) (*inventory.Inventory, state.Snapshot, []Condition) {
	mine, others := s.contested(claims)
	var conds []Condition
	conflict := func(kind, name, zone string) {
		gs := slices.Clone(others[zone])
		sort.Strings(gs)
		conds = append(conds, Condition{Subject: kind + "/" + name, Type: CondZoneClaimConflict, Reason: CondZoneClaimConflict,
			Message: fmt.Sprintf("zone %s is claimed by controller groups %s and %s (--zones); neither plans it until one drops the zone", zone, s.Group, strings.Join(gs, ", "))})
	}
	zoneOf := map[string]string{} // server → zone, servers.yaml first
	for name, obs := range have.Servers {
		zoneOf[name] = obs.Zone
	}
	var out *inventory.Inventory
	if want != nil {
		out = &inventory.Inventory{Images: want.Images, Digest: want.Digest}
		pinned := map[string]bool{}
		used := map[string]bool{}
		for _, ws := range want.Servers {
			used[ws.Zone] = true
		}
		for _, z := range s.Zones {
			if !used[z] {
				conds = append(conds, Condition{Subject: "inventory", Type: CondZoneHasNoServers, Reason: CondZoneHasNoServers,
					Message: fmt.Sprintf("controller group %s claims zone %s, which no server in servers.yaml is in (a typo in --zones?)", s.Group, z)})
			}
		}
		for _, ws := range want.Servers {
			zoneOf[ws.Name] = ws.Zone
			switch {
			case !mine[ws.Zone]:
			case len(others[ws.Zone]) > 0:
				conflict("server", ws.Name, ws.Zone)
			default:
				out.Servers = append(out.Servers, ws)
				if ws.Profile != "" {
					pinned[ws.Profile] = true
				}
			}
		}
		for _, p := range want.Profiles {
			switch {
			case p.Zone != "" && mine[p.Zone] && len(others[p.Zone]) > 0:
				conflict("profile", p.Name, p.Zone)
			case p.Zone != "" && mine[p.Zone], pinned[p.Name]:
				out.Profiles = append(out.Profiles, p)
			case p.Zone == "":
				conds = append(conds, Condition{Subject: "profile/" + p.Name, Type: CondProfileOutOfScope, Reason: "NoZone",
					Message: fmt.Sprintf("profile has no zone: controller group %s plans only profiles of its zones (%s) and those its servers are pinned to", s.Group, strings.Join(s.Zones, ", "))})
			}
		}
	}
	kept := state.Snapshot{Servers: make(map[string]*state.Server, len(have.Servers)), Hosts: have.Hosts, LastEventSeq: have.LastEventSeq}
	for name, obs := range have.Servers {
		z := zoneOf[name]
		if !mine[z] {
			continue
		}
		if len(others[z]) > 0 {
			if want == nil || want.Server(name) == nil {
				conflict("server", name, z)
			}
			continue
		}
		kept.Servers[name] = obs
	}
	SortConditions(conds)
	return out, kept, conds
}

// contested returns s's zones as a set and, per zone of s, the other
// groups claiming it too.
func (s Scope) contested(claims map[string][]string) (mine map[string]bool, others map[string][]string) {
	mine = map[string]bool{}
	for _, z := range s.Zones {
		mine[z] = true
	}
	others = map[string][]string{}
	for g, zs := range claims {
		if g == s.Group {
			continue
		}
		for _, z := range zs {
			if mine[z] {
				others[z] = append(others[z], g)
			}
		}
	}
	return mine, others
}

// Contains reports whether a server or profile zone is one of s's zones.
func (s Scope) Contains(zone string) bool { return slices.Contains(s.Zones, zone) }
