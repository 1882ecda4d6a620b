package inventory

import (
	"fmt"
	"net"
	"net/url"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/crypto/ssh"

	"github.com/machina-metal/machina/macaddr"
)

// NormalizeBMCAddress returns the form two addresses of the same BMC share:
// for redfish the scheme and host lower-cased, the default port (443 for
// https, 80 for http) and a trailing "/" dropped; for ipmi the host
// lower-cased with port 623 (IPMI v2.0 §13.1, RMCP port) made explicit.
func NormalizeBMCAddress(driver BMCDriver, addr string) string {
	if driver == DriverIPMI {
		host, port, err := net.SplitHostPort(addr)
		if err != nil {
			host, port = strings.Trim(addr, "[]"), "623"
		}
		return net.JoinHostPort(strings.ToLower(host), port)
	}
	u, err := url.Parse(addr)
	if err != nil {
		return strings.ToLower(addr)
	}
	scheme := strings.ToLower(u.Scheme)
	host := strings.ToLower(u.Hostname())
	port := u.Port()
	if (scheme == "https" && port == "443") || (scheme == "http" && port == "80") {
		port = ""
	}
	hp := host
	if strings.Contains(host, ":") {
		hp = "[" + host + "]"
	}
	if port != "" {
		hp += ":" + port
	}
	return scheme + "://" + hp + strings.TrimRight(u.EscapedPath(), "/")
}

// normalise fills defaults and puts identifiers in canonical form. It runs
// only on schema-valid input, so the MACs parse.
func normalise(inv *Inventory) {
	for i := range inv.Servers {
		s := &inv.Servers[i]
		if m, err := macaddr.Normalize(strings.TrimSpace(s.BootMAC)); err == nil {
			s.BootMAC = m
		}
		if s.BootMode == "" {
			s.BootMode = BootUEFI
		}
		if s.Want == "" {
			s.Want = WantReady
		}
	}
	for i := range inv.Profiles {
		if inv.Profiles[i].Deploy == "" {
			inv.Profiles[i].Deploy = DeployImage
		}
	}
	for i := range inv.Images {
		im := &inv.Images[i]
		if im.Arch == "" {
			im.Arch = ArchAMD64
		}
		im.Checksum = strings.ToLower(im.Checksum)
	}
}

// crossCheck runs the checks a schema cannot express: uniqueness after
// normalisation, references between files, zones that have servers, counts
// that can be met, SSH keys that parse.
//
// valid names the files that decoded cleanly; a check that reads a file
// that did not is skipped (its data is missing, and "not defined" or "no
// servers" would then be false alarms), every other check runs.
func crossCheck(inv *Inventory, docs map[string]*doc, valid map[string]bool) []FieldError {
	var out []FieldError
	haveServers, haveProfiles, haveImages := valid[ServersFile], valid[ProfilesFile], valid[ImagesFile]
	sd, pd, id := docs[ServersFile], docs[ProfilesFile], docs[ImagesFile]
	errAt := func(d *doc, pointer string, sev Severity, msg string) {
		if d == nil {
			return
		}
		fe := d.errAt(d.at(pointer), pointer, msg)
		fe.Severity = sev
		out = append(out, fe)
	}
	where := func(d *doc, pointer string) string {
		p := d.at(pointer)
		return fmt.Sprintf("%s:%d:%d", d.file, p.line, p.col)
	}

	profiles := map[string]int{}
	for i, p := range inv.Profiles {
		ptr := "/profiles/" + strconv.Itoa(i) + "/name"
		if j, dup := profiles[p.Name]; dup {
			errAt(pd, ptr, SeverityError, fmt.Sprintf("duplicate profile name %q (first at %s)", p.Name, where(pd, "/profiles/"+strconv.Itoa(j)+"/name")))
			continue
		}
		profiles[p.Name] = i
	}
	images := map[string]int{}
	for i, im := range inv.Images {
		ptr := "/images/" + strconv.Itoa(i) + "/name"
		if j, dup := images[im.Name]; dup {
			errAt(id, ptr, SeverityError, fmt.Sprintf("duplicate image name %q (first at %s)", im.Name, where(id, "/images/"+strconv.Itoa(j)+"/name")))
			continue
		}
		images[im.Name] = i
	}

	names, macs, bmcs := map[string]int{}, map[string]int{}, map[string]int{}
	zones := map[string]int{}
	for i, s := range inv.Servers {
		base := "/servers/" + strconv.Itoa(i)
		if j, dup := names[s.Name]; dup {
			errAt(sd, base+"/name", SeverityError, fmt.Sprintf("duplicate server name %q (first at %s)", s.Name, where(sd, "/servers/"+strconv.Itoa(j)+"/name")))
		} else {
			names[s.Name] = i
		}
		if m, err := macaddr.Parse(s.BootMAC); err == nil {
			switch {
			case m.IsZero():
				errAt(sd, base+"/bootMAC", SeverityError, "the all-zero MAC address is not a NIC's address")
			case m.IsGroup():
				errAt(sd, base+"/bootMAC", SeverityError, fmt.Sprintf("%s is a multicast address, not a NIC's address", s.BootMAC))
			}
		}
		if j, dup := macs[s.BootMAC]; dup {
			errAt(sd, base+"/bootMAC", SeverityError, fmt.Sprintf("boot MAC %s is also servers[%d].bootMAC (%s), after normalisation to lower-case colon form", s.BootMAC, j, where(sd, "/servers/"+strconv.Itoa(j)+"/bootMAC")))
		} else {
			macs[s.BootMAC] = i
		}
		if s.BMC.IsZero() {
			errAt(sd, base, SeverityWarning, "no BMC: Machina cannot power or boot-override this server; attach one with machinactl server bmc-set "+s.Name+" --driver ... --address ... --credentials ...")
		} else {
			addr := NormalizeBMCAddress(s.BMC.Driver, s.BMC.Address)
			if j, dup := bmcs[addr]; dup && s.BMC.SystemID == inv.Servers[j].BMC.SystemID {
				errAt(sd, base+"/bmc/address", SeverityError, fmt.Sprintf("BMC address %s is also servers[%d].bmc.address (%s); give each server on a shared BMC its own systemID", addr, j, where(sd, "/servers/"+strconv.Itoa(j)+"/bmc/address")))
			} else if !dup {
				bmcs[addr] = i
			}
		}
		if s.Want != WantRetired {
			zones[s.Zone]++
		}
		if s.Profile != "" && haveProfiles {
			if _, ok := profiles[s.Profile]; !ok {
				errAt(sd, base+"/profile", SeverityError, fmt.Sprintf("profile %q is not defined in %s", s.Profile, ProfilesFile))
			}
		}
		if s.Want == WantDeployed && s.Profile == "" {
			errAt(sd, base+"/want", SeverityError, "want: deployed needs a profile; name one in profile")
		}
		if s.Want == WantRetired && s.Profile != "" {
			errAt(sd, base+"/profile", SeverityWarning, "a retired server keeps no profile; the pin is ignored")
		}
		if len(s.BMC.SystemID) > 0 && s.BMC.Driver == DriverIPMI {
			errAt(sd, base+"/bmc/systemID", SeverityError, "systemID applies to redfish BMCs only")
		}
		if s.Arch == ArchARM64 && s.BootMode == BootBIOS {
			errAt(sd, base+"/bootMode", SeverityError, "an arm64 server boots UEFI only; bootMode bios is for x86 servers")
		}
		for _, k := range sortedLabelKeys(s.Labels) {
			ptr := base + "/labels/" + escapePointer(k)
			switch err := CheckLabelKey(k); {
			case err != nil:
				errAt(sd, ptr, SeverityError, err.Error())
			case IsDerivedLabel(k):
				errAt(sd, ptr, SeverityError, fmt.Sprintf("label %q is derived from the commissioning report and cannot be stated", k))
			case strings.HasPrefix(k, TagLabelPrefix):
				errAt(sd, ptr, SeverityError, fmt.Sprintf("label keys starting %q are the tags (tag NAME is label %sNAME: \"true\"); list the tag in tags instead", TagLabelPrefix, TagLabelPrefix))
			}
			if err := CheckLabelValue(s.Labels[k]); err != nil {
				errAt(sd, ptr, SeverityError, err.Error())
			}
		}
		if f := s.Fence; f != nil {
			if len(f.SystemID) > 0 && f.Driver == DriverIPMI {
				errAt(sd, base+"/fence/systemID", SeverityError, "systemID applies to redfish fencing devices only")
			}
			if !s.BMC.IsZero() && NormalizeBMCAddress(f.Driver, f.Address) == NormalizeBMCAddress(s.BMC.Driver, s.BMC.Address) && f.SystemID == s.BMC.SystemID {
				errAt(sd, base+"/fence/address", SeverityWarning, "the fencing device is the server's own BMC; omit fence to fence through the BMC")
			}
		}
	}

	for i, p := range inv.Profiles {
		base := "/profiles/" + strconv.Itoa(i)
		if _, ok := images[p.Image]; !ok && haveImages {
			errAt(pd, base+"/image", SeverityError, fmt.Sprintf("image %q is not defined in %s", p.Image, ImagesFile))
		}
		if p.Zone != "" && zones[p.Zone] == 0 && haveServers {
			errAt(pd, base+"/zone", SeverityError, fmt.Sprintf("zone %q has no servers in %s", p.Zone, ServersFile))
		}
		for k, key := range p.SSHKeys {
			if _, _, _, _, err := ssh.ParseAuthorizedKey([]byte(key)); err != nil {
				errAt(pd, base+"/sshKeys/"+strconv.Itoa(k), SeverityError, "is not a valid OpenSSH public key (the base64 body does not decode to a key of the named type)")
			}
		}
		if p.Count > 0 && haveServers {
			candidates := 0
			for _, s := range inv.Servers {
				if s.Want == WantRetired || (p.Zone != "" && s.Zone != p.Zone) || (s.Profile != "" && s.Profile != p.Name) {
					continue
				}
				if ok, _ := p.Selector.CouldMatch(StatedLabels(&s)); !ok {
					continue
				}
				candidates++
			}
			if p.Count > candidates {
				sel := ""
				if p.Selector != nil {
					sel = ", selector"
				}
				errAt(pd, base+"/count", SeverityWarning, fmt.Sprintf("count %d is more than the %d servers that could ever match (zone %q, not retired, not pinned to another profile%s)", p.Count, candidates, zoneOrAny(p.Zone), sel))
			}
		}
		if i, ok := images[p.Image]; ok && haveImages && haveServers {
			if sev, msg := archCoverage(p, inv.Images[i], inv.Servers); msg != "" {
				errAt(pd, base+"/image", sev, msg)
			}
		}
		if p.Selector != nil {
			bad := checkSelector(p.Selector, base+"/selector")
			for _, e := range bad {
				errAt(pd, e.ptr, SeverityError, e.msg)
			}
			if haveServers && len(bad) == 0 {
				if ok, why := selectorCanMatch(p, inv.Servers); !ok {
					errAt(pd, base+"/selector", SeverityError, "no server in "+ServersFile+" can ever match this selector: "+why)
				}
			}
		}
		if p.Deploy == DeployImage && len(p.SSHKeys) == 0 {
			errAt(pd, base, SeverityWarning, "no sshKeys: deployed hosts will accept no login")
		}
		nets := map[string]bool{}
		for k, n := range p.Join.Networks {
			if nets[n.Bridge] {
				errAt(pd, base+"/join/networks/"+strconv.Itoa(k)+"/bridge", SeverityError, fmt.Sprintf("bridge %q is named twice in this profile", n.Bridge))
			}
			nets[n.Bridge] = true
		}
		for k, sp := range p.Join.StoragePools {
			ptr := base + "/join/storagePools/" + strconv.Itoa(k)
			if strings.Contains(sp.Path, "..") {
				errAt(pd, ptr+"/path", SeverityError, "path must not contain '..'")
			}
			if sp.Type == "dir" && len(sp.Disks) > 0 {
				errAt(pd, ptr+"/disks", SeverityError, "disks apply to lvm pools only")
			}
			if sp.Type == "lvm" && sp.Path != "" {
				errAt(pd, ptr+"/path", SeverityError, "path applies to dir pools only")
			}
		}
	}
	return out
}

// archCoverage checks that some server profile p may take (not retired, in
// its zone, not pinned to another profile) can have the architecture of
// its image im: a server stating that arch, or one stating none (known
// after commissioning). An error when every such server states another
// arch; a warning for a non-amd64 image when none states it, since
// unstated servers are assumed to be amd64 until commissioning says
// otherwise (the ramdisk reports the kernel's architecture).
func archCoverage(p Profile, im Image, servers []Server) (Severity, string) {
	same, unstated := 0, 0
	others := map[string]bool{}
	for _, s := range servers {
		if s.Want == WantRetired || (p.Zone != "" && s.Zone != p.Zone) || (s.Profile != "" && s.Profile != p.Name) {
			continue
		}
		switch s.Arch {
		case im.Arch:
			same++
		case "":
			unstated++
		default:
			others[s.Arch] = true
		}
	}
	switch {
	case same > 0:
		return "", ""
	case unstated == 0 && len(others) > 0:
		return SeverityError, fmt.Sprintf("image %q is %s, but every server this profile may take in zone %q states arch %s; images are deployed only to servers of their own architecture",
			im.Name, im.Arch, zoneOrAny(p.Zone), strings.Join(sortedKeys(others), ", "))
	case im.Arch != ArchAMD64 && unstated > 0:
		return SeverityWarning, fmt.Sprintf("image %q is %s and no server this profile may take in zone %q states arch: %s; only servers whose commissioning reports %s will be deployed",
			im.Name, im.Arch, zoneOrAny(p.Zone), im.Arch, im.Arch)
	}
	return "", ""
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func zoneOrAny(z string) string {
	if z == "" {
		return "any"
	}
	return z
}

// selectorCanMatch reports whether some server p may take (not retired, in
// its zone, pinned to no other profile) could match p's selector with its
// stated labels; derived labels count as possible (known only after
// commissioning). why says what the closest candidates lack.
func selectorCanMatch(p Profile, servers []Server) (bool, string) {
	seen := 0
	var first string
	for i := range servers {
		s := &servers[i]
		if s.Want == WantRetired || (p.Zone != "" && s.Zone != p.Zone) || (s.Profile != "" && s.Profile != p.Name) {
			continue
		}
		seen++
		ok, why := p.Selector.CouldMatch(StatedLabels(s))
		if ok {
			return true, ""
		}
		if first == "" {
			first = s.Name + ": " + why
		}
	}
	if seen == 0 {
		return false, fmt.Sprintf("no server in zone %s is free for it", zoneOrAny(p.Zone))
	}
	return false, fmt.Sprintf("%d servers in zone %s, none with the stated labels (first, %s)", seen, zoneOrAny(p.Zone), first)
}

func sortedLabelKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
