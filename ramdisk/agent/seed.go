package agent

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"sort"
	"strings"
	"unicode/utf16"
	"unicode/utf8"

	v1 "github.com/machina-metal/machina/api/v1"
)

// SeedLabel is the FAT volume label of the seed. cloud-init's NoCloud source
// looks for a filesystem labelled "cidata", compared case-insensitively
// (cloudinit/sources/DataSourceNoCloud.py, fs_label).
const SeedLabel = "CIDATA"

// SeedSizeBytes is the size of the seed partition and its FAT16 filesystem (8 MiB).
const SeedSizeBytes = 8 << 20

// ErrSeedInvalid is returned (wrapped) when a seed field fails validation.
var ErrSeedInvalid = errors.New("invalid seed")

var (
	hostnameRe   = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)
	joinTokenRe  = regexp.MustCompile(`^[A-Za-z0-9_-]{16,128}$`)
	instanceIDRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)
	sshKeyRe     = regexp.MustCompile(`^(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp(256|384|521)|sk-ssh-ed25519@openssh\.com|sk-ecdsa-sha2-nistp256@openssh\.com) [A-Za-z0-9+/]+={0,3}( [^\x00-\x1f\x7f]{1,200})?$`)
)

// SeedFile is one file of the NoCloud seed.
type SeedFile struct {
	Name string
	Data []byte
}

// RenderSeed validates s and renders the NoCloud files user-data, meta-data,
// network-config and, when s has some, vendor-data. user-data creates user "machina" with passwordless
// sudo and only s.SSHKeys for login, sets ssh_pwauth false and disable_root
// true, and runs the join command (or v1.JoinPlaceholder) once via runcmd.
// s.JoinToken, when set, is written by write_files to v1.JoinTokenPath
// (0600, root:root) for the join command to read, instead of riding in
// the command line. s.UserData, the profile's own cloud-config, is merged
// after these parts (renderUserData) and s.VendorData becomes the
// vendor-data file; either one that would drop or override Machina's
// parts is refused with ErrSeedInvalid.
// Strings are emitted as JSON strings, which YAML 1.2 reads verbatim.
func RenderSeed(s v1.Seed) ([]SeedFile, error) {
	if !hostnameRe.MatchString(s.Hostname) {
		return nil, fmt.Errorf("render seed: %w: hostname %q is not an RFC 1123 label", ErrSeedInvalid, s.Hostname)
	}
	if !instanceIDRe.MatchString(s.InstanceID) {
		return nil, fmt.Errorf("render seed: %w: instance-id %q", ErrSeedInvalid, s.InstanceID)
	}
	if len(s.SSHKeys) == 0 {
		return nil, fmt.Errorf("render seed: %w: no ssh keys (password login is disabled, the host would be unreachable)", ErrSeedInvalid)
	}
	for i, k := range s.SSHKeys {
		// Go's regexp reads an invalid UTF-8 byte as U+FFFD, which the
		// comment class admits; the JSON encoder would then rewrite the key.
		if !utf8.ValidString(k) || !sshKeyRe.MatchString(k) {
			return nil, fmt.Errorf("render seed: %w: ssh key %d is not an OpenSSH public key line", ErrSeedInvalid, i)
		}
	}
	join := s.JoinCommand
	if join == "" {
		join = v1.JoinPlaceholder
	}
	if strings.ContainsAny(join, "\x00\n\r") || len(join) > 4096 || !utf8.ValidString(join) {
		return nil, fmt.Errorf("render seed: %w: join command must be one line under 4 KiB", ErrSeedInvalid)
	}
	if s.JoinToken != "" && !joinTokenRe.MatchString(s.JoinToken) {
		return nil, fmt.Errorf("render seed: %w: join token is not URL-safe base64 of 16-128 characters", ErrSeedInvalid)
	}
	if len(s.NetworkConfig) > 64<<10 || strings.ContainsRune(s.NetworkConfig, 0) || !utf8.ValidString(s.NetworkConfig) {
		return nil, fmt.Errorf("render seed: %w: network-config too large or binary", ErrSeedInvalid)
	}
	q := yamlQuote
	user, err := operatorConfig("user-data", s.UserData)
	if err != nil {
		return nil, err
	}
	vendor, err := operatorConfig("vendor-data", s.VendorData)
	if err != nil {
		return nil, err
	}
	ud := renderUserData(s, join, user)
	md := "instance-id: " + q(s.InstanceID) + "\nlocal-hostname: " + q(s.Hostname) + "\n"
	nc := s.NetworkConfig
	if nc == "" {
		nc = "version: 2\nethernets:\n  all:\n    match:\n      name: \"e*\"\n    dhcp4: true\n"
	}
	files := []SeedFile{
		{Name: "meta-data", Data: []byte(md)},
		{Name: "network-config", Data: []byte(nc)},
		{Name: "user-data", Data: []byte(ud)},
	}
	if vendor != nil {
		var vd strings.Builder
		vd.WriteString("#cloud-config\n# The profile's vendor-data (Machina's NoCloud seed); user-data overrides it.\n")
		for _, k := range mergedLists {
			if len(vendor.lists[k]) > 0 {
				vd.WriteString(k + ":\n")
				vendor.items(&vd, k)
			}
		}
		vendor.rest(&vd)
		files = append(files, SeedFile{Name: "vendor-data", Data: []byte(vd.String())})
	}
	return files, nil
}

// yamlQuote renders v as a JSON string, which YAML 1.2 (and cloud-init's
// PyYAML) reads verbatim.
func yamlQuote(v string) string {
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v) // a string always encodes
	// JSON leaves DEL and the C1 controls as they are, but YAML's
	// printable set excludes them (YAML 1.2 §5.1): escape them too.
	var out strings.Builder
	for _, r := range strings.TrimSuffix(b.String(), "\n") {
		if r == 0x7f || (r >= 0x80 && r <= 0x9f) {
			fmt.Fprintf(&out, "\\u%04x", r)
			continue
		}
		out.WriteRune(r)
	}
	return out.String()
}

// renderUserData writes the seed's user-data: Machina's parts (user
// machina with s.SSHKeys, password and root login off, the join token
// file, the join command first in runcmd) with the operator's user
// entries merged after them and its other keys added.
func renderUserData(s v1.Seed, join string, user *cloudConfig) string {
	q := yamlQuote
	var ud strings.Builder
	ud.WriteString("#cloud-config\n")
	ud.WriteString("# Written by the Machina ramdisk (NoCloud seed).\n")
	ud.WriteString("users:\n  - name: machina\n    gecos: Machina operator\n    shell: /bin/bash\n")
	ud.WriteString("    sudo: \"ALL=(ALL) NOPASSWD:ALL\"\n    lock_passwd: true\n    ssh_authorized_keys:\n")
	for _, k := range s.SSHKeys {
		ud.WriteString("      - " + q(k) + "\n")
	}
	user.items(&ud, "users")
	ud.WriteString("ssh_pwauth: false\ndisable_root: true\n")
	if s.JoinToken != "" || (user != nil && len(user.lists["write_files"]) > 0) {
		ud.WriteString("write_files:\n")
	}
	if s.JoinToken != "" {
		// write_files logs the path and size, never the content.
		ud.WriteString("  - path: " + q(v1.JoinTokenPath) + "\n    owner: \"root:root\"\n    permissions: \"0600\"\n    content: " + q(s.JoinToken) + "\n")
	}
	user.items(&ud, "write_files")
	ud.WriteString("runcmd:\n  - [sh, -c, " + q(join) + "]\n")
	user.items(&ud, "runcmd")
	user.rest(&ud)
	return ud.String()
}

// mergedLists are the cloud-config keys whose operator entries are added
// after Machina's own in user-data, rather than replacing them.
var mergedLists = []string{"users", "write_files", "runcmd"}

// cloudConfig is an operator's cloud-config mapping, split into the
// entries of the merged lists and the other keys; values are kept as
// JSON, which is YAML (1.2, and 1.1 as cloud-init's PyYAML reads it, the
// flow style spaced out) with the exact value Machina validated.
type cloudConfig struct {
	lists map[string][]json.RawMessage
	other map[string]json.RawMessage
}

// operatorConfig parses raw (a JSON object, or empty) and refuses what
// would drop or override Machina's parts: ssh_pwauth, disable_root, a
// user named machina, a write_files entry at v1.JoinTokenPath, a merged
// list that is not a list. nil for empty raw.
func operatorConfig(what string, raw json.RawMessage) (*cloudConfig, error) {
	if len(raw) == 0 {
		return nil, nil
	}
	if len(raw) > 64<<10 || !utf8.Valid(raw) {
		return nil, fmt.Errorf("render seed: %w: %s too large or not UTF-8", ErrSeedInvalid, what)
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, fmt.Errorf("render seed: %w: %s is not a cloud-config mapping: %v", ErrSeedInvalid, what, err)
	}
	c := &cloudConfig{lists: map[string][]json.RawMessage{}, other: map[string]json.RawMessage{}}
	for k, v := range m {
		switch k {
		case "ssh_pwauth", "disable_root":
			return nil, fmt.Errorf("render seed: %w: %s sets %s, which is Machina's", ErrSeedInvalid, what, k)
		case "users", "write_files", "runcmd":
			var items []json.RawMessage
			if err := json.Unmarshal(v, &items); err != nil {
				return nil, fmt.Errorf("render seed: %w: %s %s is not a list", ErrSeedInvalid, what, k)
			}
			for _, it := range items {
				var e struct {
					Name string `json:"name"`
					Path string `json:"path"`
				}
				_ = json.Unmarshal(it, &e) // a string or a list has neither
				var name string
				if json.Unmarshal(it, &name) == nil && k == "users" {
					e.Name = name
				}
				if k == "users" && e.Name == "machina" {
					return nil, fmt.Errorf("render seed: %w: %s redefines user machina", ErrSeedInvalid, what)
				}
				if k == "write_files" && e.Path == v1.JoinTokenPath {
					return nil, fmt.Errorf("render seed: %w: %s writes %s", ErrSeedInvalid, what, v1.JoinTokenPath)
				}
			}
			c.lists[k] = items
		default:
			c.other[k] = v
		}
	}
	return c, nil
}

// items writes c's entries of list k as block sequence items; nothing for
// a nil c.
func (c *cloudConfig) items(b *strings.Builder, k string) {
	if c == nil {
		return
	}
	for _, it := range c.lists[k] {
		b.WriteString("  - " + yamlJSON(it, "    ") + "\n")
	}
}

// rest writes c's other keys, sorted; nothing for a nil c.
func (c *cloudConfig) rest(b *strings.Builder) {
	if c == nil {
		return
	}
	keys := make([]string, 0, len(c.other))
	for k := range c.other {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		kq, _ := json.Marshal(k)
		b.WriteString(string(kq) + ": " + yamlJSON(c.other[k], "  ") + "\n")
	}
}

// yamlJSON re-encodes v as indented JSON whose continuation lines start
// with indent: a YAML flow node both YAML 1.1 and 1.2 read as the same
// value (JSON's ":" and "," followed by a space or a line break, as
// PyYAML's flow-context rules want).
func yamlJSON(v json.RawMessage, indent string) string {
	var out bytes.Buffer
	if err := json.Indent(&out, v, indent, "  "); err != nil {
		return "null" // cannot happen: v came from json.Unmarshal
	}
	return out.String()
}

// FAT16 layout constants for MakeFAT16.
const (
	fatSector      = 512
	fatRootEntries = 512
	fatReserved    = 1
	fatCount       = 2
)

// fatDate is the fixed timestamp of every entry (2026-01-01 00:00), so the
// seed is byte-for-byte reproducible.
const fatDate = uint16((2026-1980)<<9 | 1<<5 | 1)

// MakeFAT16 builds a FAT16 filesystem image of size bytes (a multiple of 512,
// at least 4 MiB so the cluster count is in FAT16 range) with volume label
// label (at most 11 bytes, stored upper-case as DOS does) and files in the
// root directory under VFAT long names (Microsoft FAT specification 1.03:
// BPB §3, FAT §4, directory entries §6, long names §7). hiddenSectors is the
// partition's start LBA, recorded in the BPB. Cluster size is one sector.
// It is [NewFAT16]'s extents laid over zeros.
func MakeFAT16(size int64, label string, hiddenSectors uint32, files []SeedFile) ([]byte, error) {
	fs, err := NewFAT16(size, label, hiddenSectors, files)
	if err != nil {
		return nil, err
	}
	return fs.Bytes(), nil
}

// Extent is a run of bytes at byte offset Off of an image or a device.
type Extent struct {
	Off  int64
	Data []byte
}

// FAT16 is the filesystem MakeFAT16 builds, held as the extents that carry
// its non-zero bytes: the boot sector with the BPB (FAT specification 1.03
// §3), the used head of each of the two FATs (§4: the two reserved entries
// and the files' cluster chains; the free entries after them are 0x0000),
// the used head of the root directory (§6: the volume label, each file's
// long-name and short entries; the free entries after them start with
// 0x00, "free, and no allocated entry follows", §6.1) and the files'
// clusters (§6.7: allocated from cluster 2 on, so one run). Everything
// else is zero: the rest of the FATs and root directory, the files' last
// cluster past their size, and the data area's free clusters, whose
// content FAT never reads. The extents written over a zeroed range of
// SizeBytes therefore equal MakeFAT16's image byte for byte, with a
// fraction of its writes.
type FAT16 struct {
	// SizeBytes is the filesystem's size.
	SizeBytes int64
	// Extents are sector-aligned, disjoint and ascending; the first is
	// the boot sector.
	Extents []Extent
}

// NewFAT16 lays out the filesystem MakeFAT16(size, label, hiddenSectors,
// files) builds, as its non-zero extents (see FAT16), with the same errors.
func NewFAT16(size int64, label string, hiddenSectors uint32, files []SeedFile) (*FAT16, error) {
	if size%fatSector != 0 || size < 4<<20 || size > 32<<20 {
		return nil, fmt.Errorf("make fat16: size %d out of range", size)
	}
	if len(label) == 0 || len(label) > 11 {
		return nil, fmt.Errorf("make fat16: label %q must be 1..11 bytes", label)
	}
	total := int(size / fatSector)
	rootSecs := fatRootEntries * 32 / fatSector
	fatSecs, clusters := fatLayout(total, rootSecs)
	if clusters < 4085 || clusters >= 65525 {
		return nil, fmt.Errorf("make fat16: %d clusters not in FAT16 range", clusters)
	}
	lbl := padName(strings.ToUpper(label), 11)
	bs := make([]byte, fatSector)
	writeBootSector(bs, total, fatSecs, hiddenSectors, lbl, volumeSerial(lbl, files))
	chains, root, data, err := fatFiles(lbl, files, clusters)
	if err != nil {
		return nil, fmt.Errorf("make fat16: %w", err)
	}
	fat := make([]byte, roundSector(2*len(chains)))
	for i, v := range chains {
		binary.LittleEndian.PutUint16(fat[2*i:], v)
	}
	fs := &FAT16{SizeBytes: size, Extents: []Extent{{Off: 0, Data: bs}}}
	for k := 0; k < fatCount; k++ {
		fs.Extents = append(fs.Extents, Extent{Off: int64(fatReserved+k*fatSecs) * fatSector, Data: fat})
	}
	rootOff := int64(fatReserved+fatCount*fatSecs) * fatSector
	fs.Extents = append(fs.Extents, Extent{Off: rootOff, Data: root})
	if len(data) > 0 {
		fs.Extents = append(fs.Extents, Extent{Off: rootOff + int64(rootSecs)*fatSector, Data: data})
	}
	return fs, nil
}

// SetHiddenSectors records lba, the partition's start LBA, as the BPB's
// hidden sectors (BPB_HiddSec, FAT specification 1.03 §3.1, bytes 28-31
// of the boot sector), once the partition's place is known. The rest of
// the filesystem does not depend on it.
func (f *FAT16) SetHiddenSectors(lba uint32) {
	binary.LittleEndian.PutUint32(f.Extents[0].Data[28:], lba)
}

// Bytes returns the whole image: the extents laid over SizeBytes of zeros.
func (f *FAT16) Bytes() []byte {
	img := make([]byte, f.SizeBytes)
	for _, e := range f.Extents {
		copy(img[e.Off:], e.Data)
	}
	return img
}

// WriteExtents writes the filesystem at byte offset off of dev: it zeroes
// SizeBytes there (zeroOut: BLKZEROOUT or fallocate punch-hole where dev
// has them, see [File]), then writes the extents. It returns how the range
// was zeroed and the bytes of the extents written.
func (f *FAT16) WriteExtents(dev io.WriterAt, off int64) (zeroedBy string, written int64, err error) {
	if zeroedBy, err = zeroOut(dev, off, f.SizeBytes); err != nil {
		return zeroedBy, 0, fmt.Errorf("write fat16: zero: %w", err)
	}
	for _, e := range f.Extents {
		if _, err := dev.WriteAt(e.Data, off+e.Off); err != nil {
			return zeroedBy, written, fmt.Errorf("write fat16: at %d: %w", off+e.Off, err)
		}
		written += int64(len(e.Data))
	}
	return zeroedBy, written, nil
}

// roundSector rounds n bytes up to whole sectors.
func roundSector(n int) int { return (n + fatSector - 1) / fatSector * fatSector }

// fatFiles allocates files (in order, from cluster 2) in a volume of
// clusters clusters labelled lbl and returns the used head of the FAT
// (entries 0 and 1, then every allocated cluster's entry), the used head
// of the root directory (sector-rounded) and the files' clusters.
// ErrSeedInvalid when they do not fit.
func fatFiles(lbl []byte, files []SeedFile, clusters int) (chains []uint16, root, data []byte, err error) {
	le := binary.LittleEndian
	chains = []uint16{0xFFF8, 0xFFFF}
	vol := make([]byte, 32)
	copy(vol, lbl)
	vol[11] = 0x08
	le.PutUint16(vol[24:], fatDate)
	ents := [][]byte{vol}
	used := map[string]bool{}
	for _, f := range files {
		if f.Name == "" || len(f.Name) > 64 || strings.ContainsAny(f.Name, "/\\:*?\"<>|") {
			return nil, nil, nil, fmt.Errorf("bad file name %q", f.Name)
		}
		short := shortName(f.Name, used)
		n := (len(f.Data) + fatSector - 1) / fatSector
		first := 0
		if n > 0 {
			if len(chains)+n > clusters+2 {
				return nil, nil, nil, fmt.Errorf("%w: files do not fit in %d clusters", ErrSeedInvalid, clusters)
			}
			first = len(chains)
			for c := first + 1; c < first+n; c++ {
				chains = append(chains, uint16(c))
			}
			chains = append(chains, 0xFFFF)
			data = append(data, f.Data...)
			data = append(data, make([]byte, n*fatSector-len(f.Data))...)
		}
		ents = append(ents, lfnEntries(f.Name, short)...)
		e := make([]byte, 32)
		copy(e, short)
		e[11] = 0x20
		le.PutUint16(e[16:], fatDate) // created
		le.PutUint16(e[18:], fatDate) // accessed
		le.PutUint16(e[24:], fatDate) // modified
		le.PutUint16(e[26:], uint16(first))
		le.PutUint32(e[28:], uint32(len(f.Data)))
		ents = append(ents, e)
	}
	if len(ents) > fatRootEntries {
		return nil, nil, nil, fmt.Errorf("too many root entries")
	}
	root = make([]byte, roundSector(32*len(ents)))
	for i, e := range ents {
		copy(root[i*32:], e)
	}
	return chains, root, data, nil
}

// fatLayout returns the sectors of one FAT and the cluster count for a
// volume of total sectors: the smallest fatSecs with fatSecs >=
// (clusters+2)*2/512, where clusters = total-reserved-root-2*fatSecs.
func fatLayout(total, rootSecs int) (fatSecs, clusters int) {
	fatSecs = 1
	for {
		clusters = total - fatReserved - rootSecs - fatCount*fatSecs
		need := ((clusters+2)*2 + fatSector - 1) / fatSector
		if need <= fatSecs {
			return fatSecs, clusters
		}
		fatSecs = need
	}
}

// writeBootSector fills bs, the FAT16 boot sector with its BIOS parameter
// block (Microsoft FAT specification 1.03 §3.1–3.3): one sector per cluster,
// total sectors total, FAT size fatSecs, the partition's start LBA as hidden
// sectors, volume label lbl (11 bytes) and volume serial serial.
func writeBootSector(bs []byte, total, fatSecs int, hiddenSectors uint32, lbl []byte, serial uint32) {
	le := binary.LittleEndian
	copy(bs[0:], []byte{0xEB, 0x3C, 0x90})
	copy(bs[3:11], "MACHINA ")
	le.PutUint16(bs[11:], fatSector)
	bs[13] = 1 // sectors per cluster
	le.PutUint16(bs[14:], fatReserved)
	bs[16] = fatCount
	le.PutUint16(bs[17:], fatRootEntries)
	if total < 65536 {
		le.PutUint16(bs[19:], uint16(total))
	} else {
		le.PutUint32(bs[32:], uint32(total))
	}
	bs[21] = 0xF8
	le.PutUint16(bs[22:], uint16(fatSecs))
	le.PutUint16(bs[24:], 32) // sectors per track
	le.PutUint16(bs[26:], 64) // heads
	le.PutUint32(bs[28:], hiddenSectors)
	bs[36] = 0x80
	bs[38] = 0x29
	le.PutUint32(bs[39:], serial)
	copy(bs[43:54], lbl)
	copy(bs[54:62], "FAT16   ")
	bs[510], bs[511] = 0x55, 0xAA
}

// volumeSerial is the seed filesystem's volume serial (BS_VolID, FAT
// specification §3.3): the first four bytes of the SHA-256 of the label and
// the files' names and contents, so the seed stays byte-for-byte
// reproducible while each deploy's seed (its own instance-id) gets its own.
// Firmware and boot loaders find filesystems by it (GRUB's search
// --fs-uuid, Linux's /dev/disk/by-uuid): a fixed serial collided with the
// same fixed serial of an image's ESP (the VM lab's image, 4D41-4348), and
// GRUB, searching the ESP by it, found the seed and no kernel.
func volumeSerial(lbl []byte, files []SeedFile) uint32 {
	h := sha256.New()
	h.Write(lbl)
	for _, f := range files {
		fmt.Fprintf(h, "%d:%s%d:", len(f.Name), f.Name, len(f.Data))
		h.Write(f.Data)
	}
	return binary.LittleEndian.Uint32(h.Sum(nil))
}

func padName(s string, n int) []byte {
	b := []byte(strings.Repeat(" ", n))
	copy(b, s)
	return b
}

// shortName makes a unique 8.3 alias "BASIS~N" for a long name (FAT spec §7.4,
// simplified: the long name always carries the real name).
func shortName(long string, used map[string]bool) []byte {
	var basis []byte
	for _, r := range strings.ToUpper(long) {
		if len(basis) == 6 {
			break
		}
		if (r >= 'A' && r <= 'Z') || (r >= '0' && r <= '9') || r == '-' || r == '_' {
			basis = append(basis, byte(r))
		}
	}
	if len(basis) == 0 {
		basis = []byte("FILE")
	}
	for i := 1; ; i++ {
		s := fmt.Sprintf("%s~%d", basis, i)
		if len(s) > 8 {
			s = s[len(s)-8:]
		}
		if !used[s] {
			used[s] = true
			return padName(s, 11)
		}
	}
}

// lfnEntries returns the VFAT long-name entries for long, in on-disk order
// (last part first), each carrying the checksum of the 11-byte short name.
func lfnEntries(long string, short []byte) [][]byte {
	var sum byte
	for _, c := range short[:11] {
		sum = (sum>>1 | sum<<7) + c
	}
	u := utf16.Encode([]rune(long))
	if len(u)%13 != 0 {
		u = append(u, 0)
		for len(u)%13 != 0 {
			u = append(u, 0xFFFF)
		}
	}
	n := len(u) / 13
	out := make([][]byte, n)
	for i := 0; i < n; i++ {
		e := make([]byte, 32)
		seq := byte(i + 1)
		if i == n-1 {
			seq |= 0x40
		}
		e[0] = seq
		e[11] = 0x0F
		e[13] = sum
		part := u[i*13 : i*13+13]
		offs := []int{1, 3, 5, 7, 9, 14, 16, 18, 20, 22, 24, 28, 30}
		for j, o := range offs {
			binary.LittleEndian.PutUint16(e[o:], part[j])
		}
		out[n-1-i] = e
	}
	return out
}
