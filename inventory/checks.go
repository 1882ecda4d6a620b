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
		normaliseNICs(s)
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
	normaliseNetworks(inv)
}

// crossCheck runs the checks a schema cannot express: uniqueness after
// normalisation, references between files, zones that have servers, counts
// that can be met, SSH keys that parse.
//
// valid names the files that decoded cleanly; a check that reads a file
// that did not is skipped (its data is missing, and "not defined" or "no
// servers" would then be false alarms), every other check runs.
func crossCheck(inv *Inventory, docs map[string]*doc, valid map[string]bool) []FieldError {
	c := &crossChecker{inv: inv, haveServers: valid[ServersFile], haveProfiles: valid[ProfilesFile], haveImages: valid[ImagesFile],
		sd: docs[ServersFile], pd: docs[ProfilesFile], id: docs[ImagesFile],
		profiles: map[string]int{}, images: map[string]int{}, names: map[string]int{}, macs: map[string]int{}, bmcs: map[string]int{},
		zones: map[string]int{}, retiredZones: map[string]int{}}
	for i, p := range inv.Profiles {
		c.unique(c.pd, c.profiles, "profile", "/profiles/", i, p.Name)
	}
	for i, im := range inv.Images {
		c.unique(c.id, c.images, "image", "/images/", i, im.Name)
	}
	c.firmwareCatalog()
	for i, s := range inv.Servers {
		c.server(i, s)
	}
	for i, p := range inv.Profiles {
		c.profile(i, p)
	}
	c.networks(docs[NetworksFile], valid[NetworksFile])
	for i := range inv.Profiles {
		c.cloudInit(i)
	}
	return c.out
}

// crossChecker holds one run of crossCheck: the documents, which files
// are valid on their own, the names, MACs and BMC addresses seen so far,
// servers per zone, and the errors found.
type crossChecker struct {
	inv                                   *Inventory
	haveServers, haveProfiles, haveImages bool
	sd, pd, id                            *doc
	profiles, images                      map[string]int // name → index
	fwImages                              map[string]int // firmware catalog name → index
	names, macs, bmcs                     map[string]int // server name, boot MAC, BMC address → index
	zones                                 map[string]int // servers per zone, not retired
	retiredZones                          map[string]int // retired servers per zone
	out                                   []FieldError
}

func (c *crossChecker) errAt(d *doc, pointer string, sev Severity, msg string) {
	if d == nil {
		return
	}
	fe := d.errAt(d.at(pointer), pointer, msg)
	fe.Severity = sev
	c.out = append(c.out, fe)
}

func (c *crossChecker) where(d *doc, pointer string) string {
	p := d.at(pointer)
	return fmt.Sprintf("%s:%d:%d", d.file, p.line, p.col)
}

// unique records entry i's name in seen, or reports it as a duplicate.
func (c *crossChecker) unique(d *doc, seen map[string]int, kind, list string, i int, name string) {
	if j, dup := seen[name]; dup {
		c.errAt(d, list+strconv.Itoa(i)+"/name", SeverityError, fmt.Sprintf("duplicate %s name %q (first at %s)", kind, name, c.where(d, list+strconv.Itoa(j)+"/name")))
		return
	}
	seen[name] = i
}

// server checks servers[i]: unique name, boot MAC and BMC, its profile,
// want, systemID, boot mode, labels and fencing device.
func (c *crossChecker) server(i int, s Server) {
	sd, base := c.sd, "/servers/"+strconv.Itoa(i)
	c.unique(sd, c.names, "server", "/servers/", i, s.Name)
	c.serverMAC(base, i, s)
	c.serverBMC(base, i, s)
	if s.Want != WantRetired {
		c.zones[s.Zone]++
	} else {
		c.retiredZones[s.Zone]++
	}
	if s.Profile != "" && c.haveProfiles {
		if _, ok := c.profiles[s.Profile]; !ok {
			c.errAt(sd, base+"/profile", SeverityError, fmt.Sprintf("profile %q is not defined in %s", s.Profile, ProfilesFile))
		}
	}
	if s.Want == WantDeployed && s.Profile == "" {
		c.errAt(sd, base+"/want", SeverityError, "want: deployed needs a profile; name one in profile")
	}
	if s.Want == WantRetired && s.Profile != "" {
		c.errAt(sd, base+"/profile", SeverityWarning, "a retired server keeps no profile; the pin is ignored")
	}
	if len(s.BMC.SystemID) > 0 && s.BMC.Driver == DriverIPMI {
		c.errAt(sd, base+"/bmc/systemID", SeverityError, "systemID applies to redfish BMCs only")
	}
	if s.Arch == ArchARM64 && s.BootMode == BootBIOS {
		c.errAt(sd, base+"/bootMode", SeverityError, "an arm64 server boots UEFI only; bootMode bios is for x86 servers")
	}
	c.serverLabels(base, s)
	c.serverNICs(base, s)
	if f := s.Fence; f != nil {
		if len(f.SystemID) > 0 && f.Driver == DriverIPMI {
			c.errAt(sd, base+"/fence/systemID", SeverityError, "systemID applies to redfish fencing devices only")
		}
		if !s.BMC.IsZero() && NormalizeBMCAddress(f.Driver, f.Address) == NormalizeBMCAddress(s.BMC.Driver, s.BMC.Address) && f.SystemID == s.BMC.SystemID {
			c.errAt(sd, base+"/fence/address", SeverityWarning, "the fencing device is the server's own BMC; omit fence to fence through the BMC")
		}
	}
}

// serverMAC checks that servers[i]'s boot MAC is a NIC's address and no
// other server's.
func (c *crossChecker) serverMAC(base string, i int, s Server) {
	sd := c.sd
	if m, err := macaddr.Parse(s.BootMAC); err == nil {
		switch {
		case m.IsZero():
			c.errAt(sd, base+"/bootMAC", SeverityError, "the all-zero MAC address is not a NIC's address")
		case m.IsGroup():
			c.errAt(sd, base+"/bootMAC", SeverityError, fmt.Sprintf("%s is a multicast address, not a NIC's address", s.BootMAC))
		}
	}
	if j, dup := c.macs[s.BootMAC]; dup {
		c.errAt(sd, base+"/bootMAC", SeverityError, fmt.Sprintf("boot MAC %s is also servers[%d].bootMAC (%s), after normalisation to lower-case colon form", s.BootMAC, j, c.where(sd, "/servers/"+strconv.Itoa(j)+"/bootMAC")))
	} else {
		c.macs[s.BootMAC] = i
	}
}

// serverBMC warns about a server without a BMC and refuses a BMC address
// (and systemID) another server has.
func (c *crossChecker) serverBMC(base string, i int, s Server) {
	sd := c.sd
	if s.BMC.IsZero() {
		c.errAt(sd, base, SeverityWarning, "no BMC: Machina cannot power or boot-override this server; attach one with machinactl server bmc-set "+s.Name+" --driver ... --address ... --credentials ...")
		return
	}
	addr := NormalizeBMCAddress(s.BMC.Driver, s.BMC.Address)
	if j, dup := c.bmcs[addr]; dup && s.BMC.SystemID == c.inv.Servers[j].BMC.SystemID {
		c.errAt(sd, base+"/bmc/address", SeverityError, fmt.Sprintf("BMC address %s is also servers[%d].bmc.address (%s); give each server on a shared BMC its own systemID", addr, j, c.where(sd, "/servers/"+strconv.Itoa(j)+"/bmc/address")))
	} else if !dup {
		c.bmcs[addr] = i
	}
}

// serverLabels checks a server's stated labels: valid keys and values,
// neither derived nor tag keys.
func (c *crossChecker) serverLabels(base string, s Server) {
	for _, k := range sortedLabelKeys(s.Labels) {
		ptr := base + "/labels/" + escapePointer(k)
		switch err := CheckLabelKey(k); {
		case err != nil:
			c.errAt(c.sd, ptr, SeverityError, err.Error())
		case IsDerivedLabel(k):
			c.errAt(c.sd, ptr, SeverityError, fmt.Sprintf("label %q is derived from the commissioning report and cannot be stated", k))
		case strings.HasPrefix(k, TagLabelPrefix):
			c.errAt(c.sd, ptr, SeverityError, fmt.Sprintf("label keys starting %q are the tags (tag NAME is label %sNAME: \"true\"); list the tag in tags instead", TagLabelPrefix, TagLabelPrefix))
		}
		if err := CheckLabelValue(s.Labels[k]); err != nil {
			c.errAt(c.sd, ptr, SeverityError, err.Error())
		}
	}
}

// profile checks profiles[i]: its image, zone, SSH keys, count, the
// image's architecture coverage, selector, logins and join options.
func (c *crossChecker) profile(i int, p Profile) {
	pd, base := c.pd, "/profiles/"+strconv.Itoa(i)
	if _, ok := c.images[p.Image]; !ok && c.haveImages {
		c.errAt(pd, base+"/image", SeverityError, fmt.Sprintf("image %q is not defined in %s", p.Image, ImagesFile))
	}
	// A zone whose servers are all retired is being retired: valid for
	// a profile that keeps none deployed (count 0).
	switch {
	case p.Zone == "" || c.zones[p.Zone] > 0 || !c.haveServers:
	case c.retiredZones[p.Zone] == 0:
		c.errAt(pd, base+"/zone", SeverityError, fmt.Sprintf("zone %q has no servers in %s", p.Zone, ServersFile))
	case p.Count > 0:
		c.errAt(pd, base+"/zone", SeverityError, fmt.Sprintf("zone %q has only retired servers in %s (%d): set count to 0 to retire the zone, or bring servers back", p.Zone, ServersFile, c.retiredZones[p.Zone]))
	}
	for k, key := range p.SSHKeys {
		if _, _, _, _, err := ssh.ParseAuthorizedKey([]byte(key)); err != nil {
			c.errAt(pd, base+"/sshKeys/"+strconv.Itoa(k), SeverityError, "is not a valid OpenSSH public key (the base64 body does not decode to a key of the named type)")
		}
	}
	c.profileCount(base, p)
	if j, ok := c.images[p.Image]; ok && c.haveImages && c.haveServers {
		if sev, msg := archCoverage(p, c.inv.Images[j], c.inv.Servers); msg != "" {
			c.errAt(pd, base+"/image", sev, msg)
		}
	}
	if p.Selector != nil {
		bad := checkSelector(p.Selector, base+"/selector")
		for _, e := range bad {
			c.errAt(pd, e.ptr, SeverityError, e.msg)
		}
		if c.haveServers && len(bad) == 0 {
			if ok, why := selectorCanMatch(p, c.inv.Servers); !ok {
				c.errAt(pd, base+"/selector", SeverityError, "no server in "+ServersFile+" can ever match this selector: "+why)
			}
		}
	}
	if p.Deploy == DeployImage && len(p.SSHKeys) == 0 {
		c.errAt(pd, base, SeverityWarning, "no sshKeys: deployed hosts will accept no login")
	}
	c.profileJoin(base, p)
	c.profileFirmware(base, p)
	c.profileStorage(base, p)
	c.profileErase(base, p)
}

// profileFirmware checks a profile's firmware block: RAID volume names
// unique and drive counts the level can take, components named once, an
// update image that exists in images.yaml with a sha256 checksum (the
// controller serves it to the BMC and checks it first), and a warning for
// each server pinned to the profile whose BMC is IPMI (IPMI has no BIOS
// attribute, RAID, update or Secure Boot model: the server gets
// FirmwareUnsupported and is not deployed).
func (c *crossChecker) profileFirmware(base string, p Profile) {
	fw := p.Firmware
	if fw == nil {
		return
	}
	pd, base := c.pd, base+"/firmware"
	vols := map[string]int{}
	for k, v := range fw.RAID {
		ptr := base + "/raid/" + strconv.Itoa(k)
		if j, dup := vols[v.Name]; dup {
			c.errAt(pd, ptr+"/name", SeverityError, fmt.Sprintf("volume %q is named twice (first at %s)", v.Name, c.where(pd, base+"/raid/"+strconv.Itoa(j)+"/name")))
		} else {
			vols[v.Name] = k
		}
		if min, ok := RAIDMinDrives[v.Level]; ok && v.Drives.Count < min {
			c.errAt(pd, ptr+"/drives/count", SeverityError, fmt.Sprintf("%s takes at least %d drives, not %d", v.Level, min, v.Drives.Count))
		} else if v.Level == RAID10 && v.Drives.Count%2 != 0 {
			c.errAt(pd, ptr+"/drives/count", SeverityError, fmt.Sprintf("RAID10 takes an even number of drives, not %d", v.Drives.Count))
		}
	}
	comps := map[string]int{}
	for k, fv := range fw.Versions {
		ptr := base + "/versions/" + strconv.Itoa(k)
		if j, dup := comps[fv.Component]; dup {
			c.errAt(pd, ptr+"/component", SeverityError, fmt.Sprintf("component %q is named twice (first at %s)", fv.Component, c.where(pd, base+"/versions/"+strconv.Itoa(j)+"/component")))
		} else {
			comps[fv.Component] = k
		}
		if !c.haveImages {
			continue
		}
		if _, ok := c.fwImages[fv.Image]; !ok {
			msg := fmt.Sprintf("firmware image %q is not in the firmware catalog of %s (firmware: [{name, url, checksum: sha256:..., sizeBytes}])", fv.Image, ImagesFile)
			if _, os := c.images[fv.Image]; os {
				msg = fmt.Sprintf("%q is an OS image of %s; a firmware version names an entry of its firmware catalog", fv.Image, ImagesFile)
			}
			c.errAt(pd, ptr+"/image", SeverityError, msg)
		}
	}
	if !c.haveServers {
		return
	}
	for i, s := range c.inv.Servers {
		if s.Profile == p.Name && s.BMC.Driver == DriverIPMI {
			c.errAt(c.sd, "/servers/"+strconv.Itoa(i)+"/profile", SeverityWarning, fmt.Sprintf("profile %q sets firmware state and this server's BMC is IPMI, which has no BIOS settings, RAID, update or Secure Boot interface: it will not be deployed (FirmwareUnsupported)", p.Name))
		}
	}
}

// firmwareCatalog checks images.yaml's firmware catalog: names unique,
// and none also an OS image's name (both are kept in the controller's
// image store by name).
func (c *crossChecker) firmwareCatalog() {
	c.fwImages = map[string]int{}
	for i, fi := range c.inv.FirmwareImages {
		c.unique(c.id, c.fwImages, "firmware image", "/firmware/", i, fi.Name)
		if j, ok := c.images[fi.Name]; ok {
			c.errAt(c.id, "/firmware/"+strconv.Itoa(i)+"/name", SeverityError, fmt.Sprintf("firmware image %q has the name of the OS image at %s (the image store keeps both by name)", fi.Name, c.where(c.id, "/images/"+strconv.Itoa(j)+"/name")))
		}
	}
}

// profileCount warns when a profile's count is more than the servers that
// could ever match it.
func (c *crossChecker) profileCount(base string, p Profile) {
	if p.Count <= 0 || !c.haveServers {
		return
	}
	candidates := 0
	for i := range c.inv.Servers {
		s := &c.inv.Servers[i]
		if s.Want == WantRetired || (p.Zone != "" && s.Zone != p.Zone) || (s.Profile != "" && s.Profile != p.Name) {
			continue
		}
		if ok, _ := p.Selector.CouldMatch(StatedLabels(s)); !ok {
			continue
		}
		candidates++
		if candidates >= p.Count {
			return // enough: the count is met, and the number is only shown when it is not
		}
	}
	if p.Count > candidates {
		sel := ""
		if p.Selector != nil {
			sel = ", selector"
		}
		c.errAt(c.pd, base+"/count", SeverityWarning, fmt.Sprintf("count %d is more than the %d servers that could ever match (zone %q, not retired, not pinned to another profile%s)", p.Count, candidates, zoneOrAny(p.Zone), sel))
	}
}

// profileJoin checks a profile's join options: bridges named once,
// storage pool paths and disks that fit their type.
func (c *crossChecker) profileJoin(base string, p Profile) {
	pd := c.pd
	nets := map[string]bool{}
	for k, n := range p.Join.Networks {
		if nets[n.Bridge] {
			c.errAt(pd, base+"/join/networks/"+strconv.Itoa(k)+"/bridge", SeverityError, fmt.Sprintf("bridge %q is named twice in this profile", n.Bridge))
		}
		nets[n.Bridge] = true
	}
	for k, sp := range p.Join.StoragePools {
		ptr := base + "/join/storagePools/" + strconv.Itoa(k)
		if strings.Contains(sp.Path, "..") {
			c.errAt(pd, ptr+"/path", SeverityError, "path must not contain '..'")
		}
		if sp.Type == "dir" && len(sp.Disks) > 0 {
			c.errAt(pd, ptr+"/disks", SeverityError, "disks apply to lvm pools only")
		}
		if sp.Type == "lvm" && sp.Path != "" {
			c.errAt(pd, ptr+"/path", SeverityError, "path applies to dir pools only")
		}
	}
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
