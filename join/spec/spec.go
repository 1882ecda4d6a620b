// Package spec validates what an enrolment token asks a node to build:
// host names, Linux bridges over NICs (optionally on a VLAN) and storage
// pools (directories, LVM volume groups). The controller validates when it
// issues a token and again when a host joins; machina-node validates once
// more before anything reaches netlink, a file path or an lvm2 command line.
//
// It imports api/v1 and namerule only, so the node agent stays small.
package spec

import (
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"regexp"
	"strings"

	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/namerule"
)

// ErrInvalid is wrapped by every validation error.
var ErrInvalid = errors.New("invalid join spec")

// FieldError names the offending field (e.g. "networks[1].vlan").
type FieldError struct {
	Field string
	Msg   string
}

// Error is "FIELD: MSG".
func (e *FieldError) Error() string { return e.Field + ": " + e.Msg }

// Unwrap returns ErrInvalid.
func (e *FieldError) Unwrap() error { return ErrInvalid }

func bad(field, format string, args ...any) error {
	return &FieldError{Field: field, Msg: fmt.Sprintf(format, args...)}
}

// The name rules are namerule's (one definition shared with the inventory
// schema and its cross-file checks).
var (
	labelRE  = namerule.Label
	ifnameRE = namerule.Ifname
	tagRE    = namerule.Tag
	// LVM VG names: a tag that lvm(8) "VALID NAMES" also accepts (no
	// snapshot or pvmove prefix), so a profile's pool name the schema
	// accepts is one the node can create.
	vgRE   = namerule.VolumeGroup
	diskRE = regexp.MustCompile(`^/dev/[A-Za-z0-9_][A-Za-z0-9_/.:-]*$`)
)

// Hostname checks an RFC 1123 label (lower case, 1-63 characters).
func Hostname(name string) error {
	if !labelRE.Valid(name) {
		return bad("hostname", "%q is not an RFC 1123 label (lower-case letters, digits and '-', at most 63)", name)
	}
	return nil
}

// Label checks an optional site/rack name: empty or an RFC 1123 label.
func Label(field, v string) error {
	if v != "" && !labelRE.Valid(v) {
		return bad(field, "%q is not an RFC 1123 label", v)
	}
	return nil
}

// Tags checks tag names: 1-63 characters of letters, digits, '_', '.', '-'.
func Tags(tags []string) error {
	for i, t := range tags {
		if !tagRE.Valid(t) {
			return bad(fmt.Sprintf("tags[%d]", i), "%q is not a tag (letters, digits, '_', '.', '-', at most 63)", t)
		}
	}
	return nil
}

// Ifname checks a Linux interface name.
func Ifname(field, name string) error {
	if !ifnameRE.Valid(name) {
		return bad(field, "%q is not a Linux interface name (1-15 of letters, digits, '_', '.', '-')", name)
	}
	return nil
}

// VLANName is the name of the VLAN link for nic and vlan: "NIC.VLAN" when
// that fits in 15 bytes, else "vlanVLAN".
func VLANName(nic string, vlan int) string {
	n := fmt.Sprintf("%s.%d", nic, vlan)
	if len(n) > 15 {
		n = fmt.Sprintf("vlan%d", vlan)
	}
	return n
}

// Network checks one network: name, bridge and NIC names, VLAN 0-4094
// (0 untagged), CIDR an address with prefix length.
func Network(i int, n v1.JoinNetwork) error {
	f := fmt.Sprintf("networks[%d]", i)
	if err := Label(f+".name", n.Name); err != nil || n.Name == "" {
		return bad(f+".name", "%q is not an RFC 1123 label", n.Name)
	}
	if err := Ifname(f+".bridge", n.Bridge); err != nil {
		return err
	}
	if err := Ifname(f+".nic", n.NIC); err != nil {
		return err
	}
	if n.Bridge == n.NIC {
		return bad(f+".bridge", "bridge and NIC are both %q", n.NIC)
	}
	if n.VLAN < 0 || n.VLAN > 4094 {
		return bad(f+".vlan", "%d is not 0 (untagged) or an 802.1Q VLAN ID 1-4094", n.VLAN)
	}
	if n.VLAN > 0 && VLANName(n.NIC, n.VLAN) == n.Bridge {
		return bad(f+".bridge", "bridge %q clashes with the VLAN link name", n.Bridge)
	}
	if n.CIDR != "" {
		if _, err := netip.ParsePrefix(n.CIDR); err != nil {
			return bad(f+".cidr", "%q is not ADDRESS/PREFIX", n.CIDR)
		}
	}
	return nil
}

// Pool checks one storage pool. A dir pool needs an absolute, clean Path
// that is not "/" nor under /proc, /sys, /dev, /boot, /etc, /bin, /sbin,
// /lib, /usr. An lvm pool needs a VG name and 1-64 distinct /dev/ paths.
func Pool(i int, p v1.JoinPool) error {
	f := fmt.Sprintf("pools[%d]", i)
	switch p.Type {
	case v1.PoolDir:
		if p.Name == "" || !tagRE.Valid(p.Name) {
			return bad(f+".name", "%q is not a pool name", p.Name)
		}
		if len(p.Disks) > 0 {
			return bad(f+".disks", "a dir pool takes no disks")
		}
		return DirPath(f+".path", p.Path)
	case v1.PoolLVM:
		if !vgRE.Valid(p.Name) {
			return bad(f+".name", "%q is not an LVM volume group name", p.Name)
		}
		if p.Path != "" {
			return bad(f+".path", "an lvm pool takes disks, not a path")
		}
		if len(p.Disks) == 0 || len(p.Disks) > 64 {
			return bad(f+".disks", "want 1-64 disks, got %d", len(p.Disks))
		}
		seen := map[string]bool{}
		for j, d := range p.Disks {
			if !diskRE.MatchString(d) || filepath.Clean(d) != d || strings.Contains(d, "..") {
				return bad(fmt.Sprintf("%s.disks[%d]", f, j), "%q is not a clean /dev/ path", d)
			}
			if seen[d] {
				return bad(fmt.Sprintf("%s.disks[%d]", f, j), "%q listed twice", d)
			}
			seen[d] = true
		}
		return nil
	default:
		return bad(f+".type", "%q is not %q or %q", p.Type, v1.PoolDir, v1.PoolLVM)
	}
}

var systemDirs = []string{"/proc", "/sys", "/dev", "/boot", "/etc", "/bin", "/sbin", "/lib", "/lib64", "/usr", "/run"}

// DirPath checks a dir pool's path.
func DirPath(field, p string) error {
	if !filepath.IsAbs(p) || filepath.Clean(p) != p || p == "/" || strings.ContainsAny(p, "\x00\n") {
		return bad(field, "%q is not a clean absolute path other than /", p)
	}
	for _, s := range systemDirs {
		if p == s || strings.HasPrefix(p, s+"/") {
			return bad(field, "%q is under the system directory %s", p, s)
		}
	}
	return nil
}

// Require checks the names of required checks.
func Require(req []string) error {
	for i, r := range req {
		switch r {
		case v1.CheckVirt, v1.CheckKVM, v1.CheckMemory, v1.CheckHostname:
		default:
			return bad(fmt.Sprintf("require[%d]", i), "%q is not one of kvm, virt, memory", r)
		}
	}
	return nil
}

// Enrolment checks a whole enrolment request except its TTL, reporting
// every bad field (errors.Join). Names must be unique among networks,
// bridges and pools.
func Enrolment(r v1.EnrolmentRequest) error {
	var errs []error
	add := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	add(Label("site", r.Site))
	add(Label("rack", r.Rack))
	add(Label("server", r.Server))
	if r.Host != "" {
		add(Hostname(r.Host))
	}
	add(Tags(r.Tags))
	add(Require(r.Require))
	if r.MinMemoryBytes < 0 {
		add(bad("minMemoryBytes", "negative"))
	}
	bridges := map[string]bool{}
	for i, n := range r.Networks {
		add(Network(i, n))
		if bridges[n.Bridge] {
			add(bad(fmt.Sprintf("networks[%d].bridge", i), "bridge %q used twice", n.Bridge))
		}
		bridges[n.Bridge] = true
	}
	pools := map[string]bool{}
	for i, p := range r.Pools {
		add(Pool(i, p))
		if pools[p.Name] {
			add(bad(fmt.Sprintf("pools[%d].name", i), "pool %q used twice", p.Name))
		}
		pools[p.Name] = true
	}
	return errors.Join(errs...)
}
