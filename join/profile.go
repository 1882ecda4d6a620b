package join

import (
	"time"

	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/inventory"
)

// DeployEnrolment builds the enrolment request the controller issues for
// a deploy of server s with profile p (docs/architecture.md "Flow" step 4): the token
// admits only the host named s.Name, records site (the profile's join
// site, else the server's), rack, and the union of server and profile
// tags, and carries the profile's networks, storage pools and required
// checks. The memory check's threshold is 90% of p.Min.MemoryGiB (the
// kernel's MemTotal is below installed memory); zero ttl means
// DefaultTokenTTL. Pass the result to Server.IssueToken, then the answer's
// fields to RunCmd for the NoCloud seed.
func DeployEnrolment(p inventory.Profile, s inventory.Server, ttl time.Duration) v1.EnrolmentRequest {
	if ttl <= 0 {
		ttl = DefaultTokenTTL
	}
	site := p.Join.Site
	if site == "" {
		site = s.Site
	}
	var tags []string
	seen := map[string]bool{}
	for _, t := range append(append([]string(nil), s.Tags...), p.Join.Tags...) {
		if !seen[t] {
			seen[t] = true
			tags = append(tags, t)
		}
	}
	r := v1.EnrolmentRequest{Site: site, Rack: s.Rack, Tags: tags, Require: p.Join.Require,
		MinMemoryBytes: p.Min.MemoryGiB << 30 / 10 * 9, Host: s.Name, Server: s.Name, TTL: ttl.String()}
	for _, n := range p.Join.Networks {
		r.Networks = append(r.Networks, v1.JoinNetwork{Name: n.Name, Bridge: n.Bridge, NIC: n.NIC, VLAN: n.VLAN, CIDR: n.CIDR})
	}
	for _, sp := range p.Join.StoragePools {
		r.Pools = append(r.Pools, v1.JoinPool{Name: sp.Name, Type: sp.Type, Path: sp.Path, Disks: sp.Disks})
	}
	return r
}
