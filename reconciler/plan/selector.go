package plan

import (
	"fmt"
	"sort"
	"strings"

	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/state"
)

// ServerLabels returns every label a profile selector sees on a server:
// its stated labels and tags (inventory.StatedLabels) and those derived
// from its commissioning report (state.Hardware.Labels; none before
// commissioning). obs may be nil.
func ServerLabels(ws *inventory.Server, obs *state.Server) map[string]string {
	out := inventory.StatedLabels(ws)
	if obs != nil {
		for k, v := range obs.Hardware.Labels() {
			out[k] = v
		}
	}
	return out
}

// Selection says which servers a profile's selector matches and why the
// others do not (machinactl plan prints it).
type Selection struct {
	Profile  string `json:"profile"`
	Selector string `json:"selector"`
	// Matches are the servers whose labels satisfy the selector, by name.
	Matches []string `json:"matches"`
	// Rejected are the other servers and why, by name.
	Rejected []Rejection `json:"rejected,omitempty"`
}

// Rejection is one server a selector does not match.
type Rejection struct {
	Server string `json:"server"`
	Why    string `json:"why"`
}

// SelectorString renders a selector as "k=v, key In (a,b), key Exists".
func SelectorString(s *inventory.Selector) string {
	if s == nil {
		return "any"
	}
	var parts []string
	keys := make([]string, 0, len(s.MatchLabels))
	for k := range s.MatchLabels {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		parts = append(parts, k+"="+s.MatchLabels[k])
	}
	for _, r := range s.MatchExpressions {
		parts = append(parts, r.String())
	}
	return strings.Join(parts, ", ")
}

// Select evaluates p's selector over the servers of want that p could take
// (not retired, in its zone, pinned to no other profile); the others are
// rejected with that reason. A server never commissioned is matched on
// its stated labels alone and, when the selector names a derived label,
// rejected as "not commissioned yet".
func Select(p inventory.Profile, want *inventory.Inventory, have state.Snapshot) Selection {
	sel := Selection{Profile: p.Name, Selector: SelectorString(p.Selector), Matches: []string{}}
	derived := false
	for _, r := range selectorKeys(p.Selector) {
		derived = derived || inventory.IsDerivedLabel(r)
	}
	for i := range want.Servers {
		ws := &want.Servers[i]
		reject := func(why string) { sel.Rejected = append(sel.Rejected, Rejection{Server: ws.Name, Why: why}) }
		switch {
		case ws.Want == inventory.WantRetired:
			reject("want: retired")
			continue
		case ws.Profile != "" && ws.Profile != p.Name:
			reject("pinned to profile " + ws.Profile)
			continue
		case p.Zone != "" && ws.Zone != p.Zone:
			reject("zone " + ws.Zone + ", profile wants " + p.Zone)
			continue
		}
		var obs *state.Server
		if o, ok := have.Servers[ws.Name]; ok {
			obs = o
		}
		if derived && (obs == nil || obs.Hardware == nil) {
			if ok, why := p.Selector.CouldMatch(inventory.StatedLabels(ws)); !ok {
				reject(why)
			} else {
				reject("not commissioned yet: its derived labels are unknown")
			}
			continue
		}
		if ok, why := p.Selector.Explain(ServerLabels(ws, obs)); !ok {
			reject(why)
			continue
		}
		sel.Matches = append(sel.Matches, ws.Name)
	}
	return sel
}

func selectorKeys(s *inventory.Selector) []string {
	if s == nil {
		return nil
	}
	var out []string
	for k := range s.MatchLabels {
		out = append(out, k)
	}
	for _, r := range s.MatchExpressions {
		out = append(out, r.Key)
	}
	return out
}

// selectionCondition is the warning of a selector no server matches today
// (validation already refused one that no server could ever match).
func selectionCondition(s Selection) (Condition, bool) {
	if len(s.Matches) > 0 {
		return Condition{}, false
	}
	why := "no servers in servers.yaml"
	if len(s.Rejected) > 0 {
		why = fmt.Sprintf("%d servers rejected, e.g. %s: %s", len(s.Rejected), s.Rejected[0].Server, s.Rejected[0].Why)
	}
	return Condition{Subject: "profile/" + s.Profile, Type: "SelectorMatchesNone", Reason: "NoServerMatches",
		Message: fmt.Sprintf("selector %s matches no server today (%s)", s.Selector, why)}, true
}
