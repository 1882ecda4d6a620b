package discover

import (
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/go-git/go-git/v5/plumbing/object"

	"github.com/machina-metal/machina/inventory"
)

// Skip is a result or row left out of a proposal, and why.
type Skip struct {
	// Line is the input line (import) or 0 (scan).
	Line int `json:"line,omitempty"`
	// Key is the row's name or the BMC address.
	Key    string `json:"key"`
	Reason string `json:"reason"`
}

// RegisterConfig says where a scan's proposal goes.
type RegisterConfig struct {
	// Repo is the path of a local clone of the inventory repository.
	Repo string
	// Base is the branch to start from; "" means "main".
	Base string
	// CommitTo, if set, commits straight onto this existing branch (must be
	// Base); "" creates the review branch "discovered/YYYY-MM-DD" (with
	// "-2", "-3"... when taken).
	CommitTo string
	// Zone is the zone of every proposed server (required; a label).
	Zone string
	// Site, if set, is their site.
	Site string
	// Now is the clock for the branch date; nil means time.Now.
	Now func() time.Time
}

// Registered is the outcome of [Register].
type Registered struct {
	Branch  string  `json:"branch,omitempty"`
	Commit  string  `json:"commit,omitempty"`
	Added   []Entry `json:"added"`
	Skipped []Skip  `json:"skipped"`
}

// Propose turns a scan's authenticated results into servers.yaml entries
// named "bmc-<a>-<b>-<c>-<d>" (plus "-<port>" off the default port), with
// the first NIC MAC as boot MAC. Results already in inv (by name, boot
// MAC or BMC address, normalised) or without a MAC are skipped.
func Propose(rep *Report, inv *inventory.Inventory, zone, site string) ([]Entry, []Skip) {
	ix := newIndex(inv)
	var es []Entry
	var skips []Skip
	for _, r := range rep.Results {
		if r.Status != StatusAuthenticated {
			continue
		}
		if len(r.MACs) == 0 {
			skips = append(skips, Skip{Key: r.Address, Reason: "the BMC reports no NIC MAC to boot from"})
			continue
		}
		name := nameFor(r.Address)
		if why := ix.clash(name, r.MACs[0], inventory.DriverRedfish, r.Address); why != "" {
			skips = append(skips, Skip{Key: r.Address, Reason: why})
			continue
		}
		e := Entry{Name: name, Zone: zone, Site: site, BootMAC: r.MACs[0], BootMode: "uefi",
			BMC: inventory.BMC{Driver: inventory.DriverRedfish, Address: r.Address, Credentials: r.Credentials, SystemID: r.SystemID, InsecureTLS: r.InsecureTLS}}
		ix.add(e.Name, e.BootMAC, e.BMC.Driver, e.BMC.Address)
		es = append(es, e)
	}
	return es, skips
}

func nameFor(address string) string {
	u, err := url.Parse(address)
	if err != nil {
		return "bmc-unknown"
	}
	n := "bmc-" + strings.ReplaceAll(u.Hostname(), ".", "-")
	if p := u.Port(); p != "" {
		n += "-" + p
	}
	return n
}

// Register proposes rep's authenticated BMCs as new servers.yaml entries:
// it reads Base's inventory, appends the entries (see [Propose]), validates
// the result with inventory.Load and commits it onto a new review branch
// (or CommitTo). With nothing to add it commits nothing and returns the
// skips.
func Register(rep *Report, cfg RegisterConfig) (*Registered, error) {
	if cfg.Base == "" {
		cfg.Base = "main"
	}
	if cfg.CommitTo != "" && cfg.CommitTo != cfg.Base {
		return nil, fmt.Errorf("discover: --commit-to %s: only the base branch %s can be committed to directly", cfg.CommitTo, cfg.Base)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	raw, inv, err := ReadInventory(cfg.Repo, cfg.Base)
	if err != nil {
		return nil, err
	}
	es, skips := Propose(rep, inv, cfg.Zone, cfg.Site)
	out := &Registered{Added: es, Skipped: skips}
	if len(es) == 0 {
		return out, nil
	}
	servers, err := AppendEntries(raw, es)
	if err != nil {
		return nil, err
	}
	names := make([]string, len(es))
	for i, e := range es {
		names[i] = e.Name
	}
	msg := fmt.Sprintf("discovered: %d server(s) from a BMC scan of %s\n\n%s\n", len(es), rep.Range, strings.Join(names, "\n"))
	now := cfg.Now()
	sig := object.Signature{Name: "Machina discovery", Email: "discovery@machina.invalid", When: now}
	branch := cfg.CommitTo
	if branch == "" {
		day := "discovered/" + now.UTC().Format("2006-01-02")
		for i := 1; ; i++ {
			branch = day
			if i > 1 {
				branch = fmt.Sprintf("%s-%d", day, i)
			}
			h, err := Commit(Change{Repo: cfg.Repo, Base: cfg.Base, Branch: branch, Message: msg, Author: sig}, servers)
			if err == nil {
				out.Branch, out.Commit = branch, h.String()
				return out, nil
			}
			if !isBranchExists(err) || i >= 100 {
				return nil, err
			}
		}
	}
	h, err := Commit(Change{Repo: cfg.Repo, Base: cfg.Base, Branch: branch, Message: msg, Author: sig}, servers)
	if err != nil {
		return nil, err
	}
	out.Branch, out.Commit = branch, h.String()
	return out, nil
}
