package inventory

import (
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"

	"golang.org/x/crypto/ssh"
)

// NormalizeMAC returns mac in lower-case colon form (52:54:00:aa:bb:cc). It
// accepts colon, dash, dot (5254.00aa.bbcc) and bare (525400aabbcc) forms in
// any case, and refuses anything that is not a 48-bit MAC.
func NormalizeMAC(mac string) (string, error) {
	s := strings.TrimSpace(mac)
	if len(s) == 12 && !strings.ContainsAny(s, ":-.") {
		var b strings.Builder
		for i := 0; i < 12; i += 2 {
			if i > 0 {
				b.WriteByte(':')
			}
			b.WriteString(s[i : i+2])
		}
		s = b.String()
	}
	hw, err := net.ParseMAC(s)
	if err != nil || len(hw) != 6 {
		return "", fmt.Errorf("inventory: %q is not a MAC address", mac)
	}
	return hw.String(), nil
}

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
		if m, err := NormalizeMAC(s.BootMAC); err == nil {
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
			im.Arch = "amd64"
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
	zones := map[string]int{}        // servers per zone, not retired
	retiredZones := map[string]int{} // retired servers per zone
	for i, s := range inv.Servers {
		base := "/servers/" + strconv.Itoa(i)
		if j, dup := names[s.Name]; dup {
			errAt(sd, base+"/name", SeverityError, fmt.Sprintf("duplicate server name %q (first at %s)", s.Name, where(sd, "/servers/"+strconv.Itoa(j)+"/name")))
		} else {
			names[s.Name] = i
		}
		if hw, err := net.ParseMAC(s.BootMAC); err == nil {
			switch {
			case isZero(hw):
				errAt(sd, base+"/bootMAC", SeverityError, "the all-zero MAC address is not a NIC's address")
			case hw[0]&1 == 1:
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
		} else {
			retiredZones[s.Zone]++
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
	}

	for i, p := range inv.Profiles {
		base := "/profiles/" + strconv.Itoa(i)
		if _, ok := images[p.Image]; !ok && haveImages {
			errAt(pd, base+"/image", SeverityError, fmt.Sprintf("image %q is not defined in %s", p.Image, ImagesFile))
		}
		// A zone whose servers are all retired is being retired: valid for
		// a profile that keeps none deployed (count 0).
		switch {
		case p.Zone == "" || zones[p.Zone] > 0 || !haveServers:
		case retiredZones[p.Zone] == 0:
			errAt(pd, base+"/zone", SeverityError, fmt.Sprintf("zone %q has no servers in %s", p.Zone, ServersFile))
		case p.Count > 0:
			errAt(pd, base+"/zone", SeverityError, fmt.Sprintf("zone %q has only retired servers in %s (%d): set count to 0 to retire the zone, or bring servers back", p.Zone, ServersFile, retiredZones[p.Zone]))
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
				candidates++
			}
			if p.Count > candidates {
				errAt(pd, base+"/count", SeverityWarning, fmt.Sprintf("count %d is more than the %d servers that could ever match (zone %q, not retired, not pinned to another profile)", p.Count, candidates, zoneOrAny(p.Zone)))
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

func zoneOrAny(z string) string {
	if z == "" {
		return "any"
	}
	return z
}

func isZero(hw net.HardwareAddr) bool {
	for _, b := range hw {
		if b != 0 {
			return false
		}
	}
	return true
}
