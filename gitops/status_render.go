package gitops

import (
	"bytes"
	"cmp"
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-git/go-git/v5/plumbing"

	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/reconciler/plan"
	"github.com/machina-metal/machina/redact"
)

// statusFile is one rendered file, path relative to the repository root;
// hash is its Git blob id when known (zero: not computed yet). A server's
// file reused from the renderCache carries no bytes (data nil), only its
// blob id and the status of this write (from, equal to the one the kept
// file was rendered from, and maxEvents): a commit needs the bytes only
// for a blob the remote's tree lacks, and bytes renders them again then.
type statusFile struct {
	path      string
	data      []byte
	hash      plumbing.Hash
	from      *ServerStatus
	maxEvents int
}

// bytes is the file's content: data, or for a file reused from the
// renderCache the same bytes rendered again from its status.
func (f *statusFile) bytes() []byte {
	if f.data == nil && f.from != nil {
		return renderServer(*f.from, f.maxEvents)
	}
	return f.data
}

// renderCache keeps each server's last status file as its blob id and
// the fingerprint of the ServerStatus it was rendered from (MaxEvents
// too), so that a status write renders and hashes only the servers whose
// status changed: renderServer depends on nothing else, so a status with
// the same fingerprint (fingerprinter: equal encodings; any difference,
// even one that would render the same, renders again) gives the same
// bytes. Servers absent from a write are dropped. The zero value is empty
// and ready; not safe for concurrent use.
type renderCache struct {
	maxEvents int
	m         map[string]*renderedServer
	next      map[string]*renderedServer // being filled by a render
	fp        fingerprinter
	// renders counts the server files rendered (not reused) by the last
	// render; for tests.
	renders int
}

// renderedServer is one server's status file's blob id and the
// fingerprint of the status it was rendered from. Neither the bytes nor
// the status are kept: at 10,000 servers they were about 10 MB and 25 MB
// of live heap, which every collection scanned, for the few commits whose
// base lacks a reused blob (statusFile.bytes renders those again from
// the status being written, which has the same fingerprint).
type renderedServer struct {
	sum  [32]byte
	path string
	hash plumbing.Hash
}

// begin starts a render of about n servers with maxEvents.
func (c *renderCache) begin(n, maxEvents int) {
	if maxEvents != c.maxEvents {
		c.m = nil // another event limit renders every file differently
	}
	c.maxEvents, c.next, c.renders = maxEvents, make(map[string]*renderedServer, n), 0
}

// server returns sv's status file: the last one when sv's fingerprint is
// that of the status it was rendered from, else a new rendering. sv must
// stay unchanged while the file is in use (bytes may render it).
func (c *renderCache) server(sv *ServerStatus) statusFile {
	sum, ok := c.fp.sum(sv)
	if e, hit := c.m[sv.Name]; ok && hit && e.sum == sum {
		c.next[sv.Name] = e
		return statusFile{path: e.path, hash: e.hash, from: sv, maxEvents: c.maxEvents}
	}
	data := renderServer(*sv, c.maxEvents)
	e := &renderedServer{path: ServerStatusPath(sv.Name), hash: plumbing.ComputeHash(plumbing.BlobObject, data)}
	if ok {
		// Kept only with a fingerprint: a status that has none is
		// rendered again by every write.
		e.sum = sum
		c.next[sv.Name] = e
	}
	c.renders++
	return statusFile{path: e.path, data: data, hash: e.hash}
}

// end keeps this render's files for the next one.
func (c *renderCache) end() { c.m, c.next = c.next, nil }

const statusDir = "status"

const fileHeader = "# Written by the Machina controller from what it observed; do not edit by hand.\n"

// renderStatus renders s to the files of status/, sorted by path. Entries
// whose names cannot be file names are skipped and returned as errors.
// cache, when not nil, supplies the unchanged servers' files and keeps
// this render's for the next.
func renderStatus(s Snapshot, maxEvents int, cache *renderCache) ([]statusFile, []error) {
	var errs []error
	var files []statusFile
	servers := slices.Clone(s.Servers)
	slices.SortFunc(servers, func(a, b ServerStatus) int { return cmp.Compare(a.Name, b.Name) })
	images := slices.Clone(s.Images)
	slices.SortFunc(images, func(a, b ImageStatus) int { return cmp.Compare(a.Name, b.Name) })
	hosts := slices.Clone(s.Hosts)
	slices.SortFunc(hosts, func(a, b HostStatus) int { return cmp.Compare(a.Name, b.Name) })

	valid := func(kind, name string, prev *string) bool {
		if !validName(name) {
			errs = append(errs, fmt.Errorf("status: %s name %q is not a valid file name, skipped", kind, redact.String(name)))
			return false
		}
		if name == *prev {
			errs = append(errs, fmt.Errorf("status: duplicate %s %q, second skipped", kind, name))
			return false
		}
		*prev = name
		return true
	}
	var prev string
	keptServers := servers[:0]
	for _, sv := range servers {
		if valid("server", sv.Name, &prev) {
			keptServers = append(keptServers, sv)
		}
	}
	if cache != nil {
		cache.begin(len(keptServers), maxEvents)
		defer cache.end()
	}
	for i := range keptServers {
		sv := &keptServers[i] // a reused file renders from it (statusFile.from)
		if cache != nil {
			files = append(files, cache.server(sv))
		} else {
			files = append(files, statusFile{path: ServerStatusPath(sv.Name), data: renderServer(*sv, maxEvents)})
		}
	}
	prev = ""
	keptImages := images[:0]
	for _, im := range images {
		if valid("image", im.Name, &prev) {
			keptImages = append(keptImages, im)
			files = append(files, statusFile{path: statusDir + "/images/" + im.Name + ".yaml", data: renderImage(im)})
		}
	}
	prev = ""
	keptHosts := hosts[:0]
	for _, h := range hosts {
		if valid("host", h.Name, &prev) {
			keptHosts = append(keptHosts, h)
			files = append(files, statusFile{path: statusDir + "/hosts/" + h.Name + ".yaml", data: renderHost(h)})
		}
	}
	files = append(files,
		statusFile{path: statusDir + "/inventory.yaml", data: renderInventory(s.Inventory)},
		statusFile{path: statusDir + "/README.md", data: renderReadme(s.Inventory, keptServers, keptImages, keptHosts)},
	)
	slices.SortFunc(files, func(a, b statusFile) int { return cmp.Compare(a.path, b.path) })
	return files, errs
}

// ServerStatusPath is the path, from the repository root, of server
// name's status file: status/servers/XX/NAME.yaml, XX the first two
// lower-case hex digits of the SHA-1 of the name's bytes (reproduce with
// `printf %s NAME | sha1sum | cut -c1-2`). The 256 fan-out folders keep
// each Git tree small (about 40 entries at 10,000 servers), so a status
// commit that changes k servers rewrites k small trees, not one tree
// listing every server. A controller group (StatusConfig.Group) writes
// the same layout under status/GROUP/.
func ServerStatusPath(name string) string {
	return statusDir + "/" + serverStatusRel(name)
}

// serverStatusRel is ServerStatusPath relative to status/ (or status/GROUP/).
func serverStatusRel(name string) string {
	sum := sha1.Sum([]byte(name))
	return "servers/" + hex.EncodeToString(sum[:1]) + "/" + name + ".yaml"
}

// serverNameOf returns the server name of a status file path (under
// status/servers/, flat as older controllers wrote it or fanned out) and
// whether p is one.
func serverNameOf(p string) (string, bool) {
	rest, ok := strings.CutPrefix(p, statusDir+"/servers/")
	if !ok || !strings.HasSuffix(rest, ".yaml") {
		return "", false
	}
	if i := strings.LastIndexByte(rest, '/'); i >= 0 {
		rest = rest[i+1:]
	}
	return strings.TrimSuffix(rest, ".yaml"), true
}

// validName accepts names that are safe single path elements: RFC 1123
// labels extended with '.' and '_' (image names like ubuntu-24.04).
func validName(n string) bool {
	if n == "" || len(n) > 253 || n[0] == '.' || n[0] == '-' {
		return false
	}
	for i := 0; i < len(n); i++ {
		c := n[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '.' || c == '_') {
			return false
		}
	}
	return !strings.Contains(n, "..")
}

// yamlWriter emits block YAML with deterministic quoting.
type yamlWriter struct{ b bytes.Buffer }

func (w *yamlWriter) indent(n int) {
	for range n {
		w.b.WriteString("  ")
	}
}

// str writes "key: value" unless value is empty.
func (w *yamlWriter) str(ind int, key, v string) {
	if v == "" {
		return
	}
	w.indent(ind)
	w.b.WriteString(key)
	w.b.WriteString(": ")
	w.b.WriteString(yamlScalar(v))
	w.b.WriteByte('\n')
}

// text writes a redacted free-text value.
func (w *yamlWriter) text(ind int, key, v string) { w.str(ind, key, redact.String(v)) }

func (w *yamlWriter) int(ind int, key string, v int64, always bool) {
	if v == 0 && !always {
		return
	}
	w.indent(ind)
	w.b.WriteString(key)
	w.b.WriteString(": ")
	w.b.WriteString(strconv.FormatInt(v, 10))
	w.b.WriteByte('\n')
}

func (w *yamlWriter) time(ind int, key string, t time.Time) {
	if t.IsZero() {
		return
	}
	w.str(ind, key, t.UTC().Format(time.RFC3339))
}

func (w *yamlWriter) key(ind int, key string) {
	w.indent(ind)
	w.b.WriteString(key)
	w.b.WriteString(":\n")
}

// item starts a sequence item at ind: "- " then the first key follows on
// the same line, so callers write the first field with ind 0.
func (w *yamlWriter) item(ind int) {
	w.indent(ind)
	w.b.WriteString("- ")
}

func (w *yamlWriter) list(ind int, key string, vs []string) {
	if len(vs) == 0 {
		return
	}
	w.key(ind, key)
	for _, v := range vs {
		w.item(ind)
		w.b.WriteString(yamlScalar(v))
		w.b.WriteByte('\n')
	}
}

var yamlReserved = map[string]bool{"y": true, "n": true, "yes": true, "no": true, "on": true, "off": true,
	"true": true, "false": true, "null": true, "~": true}

// yamlScalar returns v plain when it cannot be read as anything but that
// string in YAML 1.1 or 1.2 (letters, digits, '.', '_', '/', '-', starting
// with a letter, not a reserved word like yes/off/null),
// otherwise double-quoted (Go escapes are a subset of YAML's) with invalid
// UTF-8 replaced by U+FFFD.
func yamlScalar(v string) string {
	plain := v != "" && len(v) < 200
	letter := false
	for i := 0; plain && i < len(v); i++ {
		c := v[i]
		switch {
		case c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z':
			letter = true
		case c >= '0' && c <= '9' && i > 0:
		case (c == '.' || c == '_' || c == '/' || c == '-') && i > 0:
		default:
			plain = false
		}
	}
	if plain && letter {
		// A plain candidate starts with a letter, so the only numbers it
		// can spell are the ones strconv.ParseFloat reads from letters
		// (inf, infinity, nan in any case); asking strconv instead
		// allocated an error per string, a fleet's worth per status write.
		switch l := strings.ToLower(v); {
		case yamlReserved[l], l == "inf", l == "infinity", l == "nan":
		default:
			return v
		}
	}
	// Invalid UTF-8 would come back as other characters ("\x92" is
	// U+0092 in YAML), so it is replaced first.
	return strconv.Quote(strings.ToValidUTF8(v, "\uFFFD"))
}

func renderServer(s ServerStatus, maxEvents int) []byte {
	var w yamlWriter
	w.b.Grow(4096)
	w.b.WriteString(fileHeader)
	w.str(0, "name", s.Name)
	w.str(0, "lifecycle", orUnknown(s.Lifecycle))
	w.str(0, "power", orUnknown(s.Power))
	w.str(0, "health", s.Health)
	w.str(0, "profile", s.Profile)
	w.str(0, "allocation", s.Allocation)
	w.addresses(s.Addresses)
	w.list(0, "bmcQuirks", s.BMCQuirks)
	w.str(0, "bmcSecurity", s.BMCSecurity)
	w.str(0, "progress", s.Progress)
	w.hardware(s.Hardware)
	w.firmware(s.Firmware)
	if s.TPM != nil {
		w.key(0, "tpm")
		w.text(1, "ek", s.TPM.EK)
		w.text(1, "ekIssuer", s.TPM.EKIssuer)
	}
	sortedList(&w, 0, "conditions", "type", s.Conditions, func(c Condition) string { return c.Type }, func(c Condition) {
		w.text(1, "status", orUnknown(c.Status))
		w.text(1, "reason", c.Reason)
		w.text(1, "message", c.Message)
		w.time(1, "lastTransitionTime", c.LastTransitionTime)
	})
	a := s.ObservedActions
	w.key(0, "observedActions")
	w.int(1, "commission", a.Commission, true)
	w.int(1, "powerCycle", a.PowerCycle, true)
	w.int(1, "powerOn", a.PowerOn, true)
	w.int(1, "powerOff", a.PowerOff, true)
	w.text(0, "lastError", s.LastError)
	w.events(s.Events, maxEvents)
	// Exact size: a fleet's server files are all held until the commit
	// is pushed, and the buffer's spare capacity would be a third more.
	return bytes.Clone(w.b.Bytes())
}

// addresses writes a server's pool addresses by subnet, interface, then
// address in numeric order; nothing when it holds none.
func (w *yamlWriter) addresses(as []AddressStatus) {
	if len(as) == 0 {
		return
	}
	sorted := slices.Clone(as)
	slices.SortFunc(sorted, func(a, b AddressStatus) int {
		if c := cmp.Compare(a.Subnet, b.Subnet); c != 0 {
			return c
		}
		if c := cmp.Compare(a.Interface, b.Interface); c != 0 {
			return c
		}
		x, _ := netip.ParseAddr(a.Address)
		y, _ := netip.ParseAddr(b.Address)
		return x.Compare(y)
	})
	w.key(0, "addresses")
	for _, a := range sorted {
		w.item(0)
		w.text(0, "address", a.Address)
		w.text(1, "interface", a.Interface)
		w.text(1, "subnet", a.Subnet)
		w.text(1, "profile", a.Profile)
	}
}

// firmware writes a server's firmware block; nothing when never read.
func (w *yamlWriter) firmware(f *FirmwareStatus) {
	if f == nil {
		return
	}
	w.key(0, "firmware")
	w.time(1, "readAt", f.ReadAt)
	w.text(1, "biosRegistry", f.Registry)
	w.int(1, "biosAttributes", int64(f.Attributes), false)
	w.int(1, "biosPending", int64(f.Pending), false)
	w.str(1, "secureBoot", f.SecureBoot)
	w.list(1, "volumes", f.Volumes)
	w.list(1, "createdVolumes", f.Created)
	w.int(1, "components", int64(f.Components), false)
	w.list(1, "unsupported", f.Unsupported)
}

// hardware writes a server's hardware: key, scalars, disks and NICs by
// name, labels by key; nothing when none is known.
func (w *yamlWriter) hardware(hw Hardware) {
	if hw.Vendor == "" && hw.Model == "" && hw.Arch == "" && hw.SMBIOSArch == "" && hw.Cores == 0 && hw.MemoryGiB == 0 && len(hw.Disks) == 0 && len(hw.NICs) == 0 {
		return
	}
	w.key(0, "hardware")
	w.text(1, "vendor", hw.Vendor)
	w.text(1, "model", hw.Model)
	w.text(1, "serial", hw.Serial)
	w.text(1, "cpuModel", hw.CPUModel)
	w.text(1, "arch", hw.Arch)
	w.text(1, "smbiosArch", hw.SMBIOSArch)
	w.int(1, "cores", int64(hw.Cores), false)
	w.int(1, "memoryGiB", hw.MemoryGiB, false)
	sortedList(w, 1, "disks", "name", hw.Disks, func(d Disk) string { return d.Name }, func(d Disk) {
		w.text(2, "model", d.Model)
		w.text(2, "serial", d.Serial)
		w.int(2, "sizeGiB", d.SizeGiB, false)
	})
	sortedList(w, 1, "nics", "name", hw.NICs, func(n NIC) string { return n.Name }, func(n NIC) {
		w.text(2, "mac", n.MAC)
		w.int(2, "speedMbps", int64(n.SpeedMbps), false)
		w.lldp(n.LLDP)
	})
	if len(hw.Labels) > 0 {
		w.key(1, "labels")
		for _, k := range slices.Sorted(maps.Keys(hw.Labels)) {
			w.str(2, k, hw.Labels[k])
		}
	}
}

// sortedList writes items as a sequence under key at ind, sorted by their
// first field (firstKey, its value first(item), written orUnknown on the
// item's line); rest writes the item's other fields at ind+1. Nothing for
// no items. A server file's conditions (by type), disks and NICs (by name).
func sortedList[T any](w *yamlWriter, ind int, key, firstKey string, items []T, first func(T) string, rest func(T)) {
	if len(items) == 0 {
		return
	}
	sorted := slices.Clone(items)
	slices.SortFunc(sorted, func(a, b T) int { return cmp.Compare(first(a), first(b)) })
	w.key(ind, key)
	for _, it := range sorted {
		w.item(ind)
		w.text(0, firstKey, orUnknown(first(it)))
		rest(it)
	}
}

// events writes a server's newest maxEvents events, newest first.
func (w *yamlWriter) events(events []StatusEvent, maxEvents int) {
	if len(events) == 0 || maxEvents <= 0 {
		return
	}
	evs := slices.Clone(events)
	slices.SortStableFunc(evs, func(a, b StatusEvent) int {
		if c := b.Time.Compare(a.Time); c != 0 {
			return c
		}
		return cmp.Or(cmp.Compare(a.Reason, b.Reason), cmp.Compare(a.Message, b.Message))
	})
	if len(evs) > maxEvents {
		evs = evs[:maxEvents]
	}
	w.key(0, "events")
	for _, e := range evs {
		w.item(0)
		if e.Time.IsZero() {
			w.b.WriteString("time: null\n")
		} else {
			w.time(0, "time", e.Time)
		}
		w.text(1, "type", e.Type)
		w.text(1, "reason", e.Reason)
		w.text(1, "message", e.Message)
	}
}

func renderImage(im ImageStatus) []byte {
	var w yamlWriter
	w.b.WriteString(fileHeader)
	w.str(0, "name", im.Name)
	w.str(0, "state", orUnknown(im.State))
	w.str(0, "checksum", im.Checksum)
	w.int(0, "sizeBytes", im.SizeBytes, false)
	w.text(0, "message", im.Message)
	return w.b.Bytes()
}

func renderHost(h HostStatus) []byte {
	var w yamlWriter
	w.b.WriteString(fileHeader)
	w.str(0, "name", h.Name)
	w.str(0, "server", h.Server)
	w.str(0, "site", h.Site)
	w.str(0, "rack", h.Rack)
	w.list(0, "tags", sortedStrings(h.Tags))
	w.str(0, "state", orUnknown(h.State))
	w.list(0, "networks", sortedStrings(h.Networks))
	w.list(0, "storagePools", sortedStrings(h.StoragePools))
	w.text(0, "message", h.Message)
	w.str(0, "agentVersion", h.AgentVersion)
	if len(h.Conditions) > 0 {
		w.key(0, "conditions")
		for _, c := range h.Conditions {
			w.item(0)
			w.text(0, "type", orUnknown(c.Type))
			w.text(1, "status", orUnknown(c.Status))
			w.text(1, "reason", c.Reason)
			w.text(1, "message", c.Message)
			w.time(1, "lastTransitionTime", c.LastTransitionTime)
		}
	}
	return w.b.Bytes()
}

func renderInventory(inv InventoryStatus) []byte {
	var w yamlWriter
	w.b.WriteString(fileHeader)
	if inv.Invalid != nil {
		w.b.WriteString("valid: false\n")
	} else {
		w.b.WriteString("valid: true\n")
	}
	if inv.Good.Commit != "" || inv.Good.Digest != "" {
		w.key(0, "actingOn")
		w.str(1, "commit", inv.Good.Commit)
		w.str(1, "digest", inv.Good.Digest)
	} else {
		w.b.WriteString("actingOn: null\n")
	}
	if inv.Invalid != nil {
		w.key(0, "newestInvalid")
		w.str(1, "commit", inv.Invalid.Commit)
		w.key(1, "errors")
		errs := slices.Clone(inv.Invalid.Errors)
		slices.SortStableFunc(errs, compareFieldErrors)
		for _, e := range errs {
			w.item(1)
			w.str(0, "file", orUnknown(e.File))
			w.int(2, "line", int64(e.Line), true)
			w.int(2, "column", int64(e.Col), false)
			w.str(2, "path", e.Path)
			w.text(2, "message", e.Msg)
		}
	}
	if inv.Held != nil {
		w.key(0, "held")
		w.text(1, "reason", inv.Held.Reason)
		steps := make([]string, len(inv.Held.Steps))
		for i, st := range inv.Held.Steps {
			steps[i] = redact.String(st)
		}
		w.list(1, "steps", steps)
	}
	if len(inv.Conditions) > 0 {
		w.key(0, "conditions")
		for _, c := range sortedConditions(inv.Conditions) {
			w.item(0)
			w.text(0, "subject", orUnknown(c.Subject))
			w.text(1, "type", orUnknown(c.Type))
			w.text(1, "reason", c.Reason)
			w.text(1, "message", c.Message)
		}
	}
	return w.b.Bytes()
}

// sortedConditions returns cs sorted by subject, then type.
func sortedConditions(cs []plan.Condition) []plan.Condition {
	cs = slices.Clone(cs)
	slices.SortStableFunc(cs, func(a, b plan.Condition) int {
		return cmp.Or(cmp.Compare(a.Subject, b.Subject), cmp.Compare(a.Type, b.Type))
	})
	return cs
}

func compareFieldErrors(a, b inventory.FieldError) int {
	return cmp.Or(cmp.Compare(a.File, b.File), cmp.Compare(a.Line, b.Line), cmp.Compare(a.Col, b.Col),
		cmp.Compare(a.Path, b.Path), cmp.Compare(a.Msg, b.Msg))
}

// renderReadme renders the fleet summary read in a Git web view: the
// inventory's state, the servers' counts per lifecycle and zone, and the
// servers that need attention, each list capped (readmeMaxRows), so its
// size does not grow with the fleet. Each server's file is
// servers/XX/NAME.yaml.
func renderReadme(inv InventoryStatus, servers []ServerStatus, images []ImageStatus, hosts []HostStatus) []byte {
	var b bytes.Buffer
	b.Grow(4096)
	b.WriteString("# Fleet status\n\n<!-- Written by the Machina controller; do not edit by hand. -->\n\n")
	switch {
	case inv.Invalid != nil:
		fmt.Fprintf(&b, "**Inventory invalid** at commit `%s`: %s, see [inventory.yaml](inventory.yaml). ", shortID(inv.Invalid.Commit), errorsCount(len(inv.Invalid.Errors)))
		if inv.Good.Commit != "" {
			fmt.Fprintf(&b, "Acting on the last good revision `%s` (`%s`).\n\n", shortID(inv.Good.Commit), shortDigest(inv.Good.Digest))
		} else {
			b.WriteString("No good revision yet.\n\n")
		}
	case inv.Good.Commit != "":
		fmt.Fprintf(&b, "Inventory valid, acting on commit `%s` (`%s`).\n\n", shortID(inv.Good.Commit), shortDigest(inv.Good.Digest))
	default:
		b.WriteString("No inventory revision yet.\n\n")
	}
	if h := inv.Held; h != nil {
		fmt.Fprintf(&b, "**Plan held by the safety brake**: %s. %s for approval, see [inventory.yaml](inventory.yaml).\n\n",
			mdCell(truncate(strings.TrimSuffix(h.Reason, "."), 300)), count(len(h.Steps), "step waits", "steps wait"))
	}
	for _, c := range sortedConditions(inv.Conditions) {
		fmt.Fprintf(&b, "**%s %s** (%s): %s.\n\n", mdCell(c.Subject), mdCell(c.Type), mdCell(c.Reason), mdCell(truncate(redact.String(c.Message), 300)))
	}
	readmeCounts(&b, servers)
	readmeAttention(&b, servers)
	if len(images) > 0 {
		b.WriteString("## Images\n\n| Image | State | Checksum | Message |\n|---|---|---|---|\n")
		for i, im := range images {
			if i == readmeMaxRows {
				fmt.Fprintf(&b, "\n… and %d more, see [images/](images/).\n", len(images)-i)
				break
			}
			fmt.Fprintf(&b, "| [%s](images/%s.yaml) | %s | %s | %s |\n", im.Name, im.Name, mdCell(orUnknown(im.State)),
				mdCell(truncate(im.Checksum, 23)), mdCell(truncate(redact.String(im.Message), 80)))
		}
		b.WriteByte('\n')
	}
	if len(hosts) > 0 {
		b.WriteString("## Hosts\n\n| Host | Server | Site | Rack | State |\n|---|---|---|---|---|\n")
		for i, h := range hosts {
			if i == readmeMaxRows {
				fmt.Fprintf(&b, "\n… and %d more, see [hosts/](hosts/).\n", len(hosts)-i)
				break
			}
			fmt.Fprintf(&b, "| [%s](hosts/%s.yaml) | %s | %s | %s | %s |\n", h.Name, h.Name, mdCell(h.Server), mdCell(h.Site),
				mdCell(h.Rack), mdCell(orUnknown(h.State)))
		}
		b.WriteByte('\n')
	}
	return b.Bytes()
}

// readmeMaxRows caps each list of status/README.md (servers that need
// attention, zones, images, hosts), so the file, rewritten by every status
// commit, stays a few KB at any fleet size; the rest is "… and N more".
const readmeMaxRows = 50

// readmeCounts writes the servers' count per lifecycle, then a table of
// the count per zone and lifecycle (capped at readmeMaxRows zones).
func readmeCounts(b *bytes.Buffer, servers []ServerStatus) {
	counts := map[string]int{}
	zones := map[string]map[string]int{}
	for _, s := range servers {
		lc := orUnknown(s.Lifecycle)
		counts[lc]++
		z := zones[s.Zone]
		if z == nil {
			z = map[string]int{}
			zones[s.Zone] = z
		}
		z[lc]++
	}
	b.WriteString(count(len(servers), "server", "servers"))
	b.WriteString(lifecycleCounts(counts, ": "))
	b.WriteString(".\n\n")
	if len(zones) == 0 || len(zones) == 1 && zones[""] != nil {
		return
	}
	b.WriteString("| Zone | Servers | Lifecycles |\n|---|---|---|\n")
	for i, z := range slices.Sorted(maps.Keys(zones)) {
		if i == readmeMaxRows {
			fmt.Fprintf(b, "\n… and %d more zones.\n", len(zones)-i)
			break
		}
		n := 0
		for _, c := range zones[z] {
			n += c
		}
		fmt.Fprintf(b, "| %s | %d | %s |\n", mdCell(cmp.Or(z, "(none)")), n, lifecycleCounts(zones[z], ""))
	}
	b.WriteByte('\n')
}

// lifecycleCounts is "3 ready, 1 failed" sorted by lifecycle, after
// prefix; "" for no counts.
func lifecycleCounts(counts map[string]int, prefix string) string {
	var b strings.Builder
	for i, k := range slices.Sorted(maps.Keys(counts)) {
		if i == 0 {
			b.WriteString(prefix)
		} else {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%d %s", counts[k], mdCell(k))
	}
	return b.String()
}

// needsAttention is true for a server that failed, has a last error or a
// condition that needs a look (conditionSummary).
func needsAttention(s ServerStatus) bool {
	return s.Lifecycle == "failed" || s.LastError != "" || conditionSummary(s.Conditions) != ""
}

// readmeAttention writes README.md's table of the servers that need
// attention (sorted by name, at most readmeMaxRows, then "… and N more");
// nothing when none does. Every server's file is in servers/XX/.
func readmeAttention(b *bytes.Buffer, servers []ServerStatus) {
	n := 0
	for _, s := range servers {
		if !needsAttention(s) {
			continue
		}
		if n == 0 {
			b.WriteString("## Needs attention\n\n| Server | Lifecycle | Power | Health | Profile | Conditions | Last error |\n|---|---|---|---|---|---|---|\n")
		}
		n++
		if n > readmeMaxRows {
			continue
		}
		b.WriteString("| [")
		b.WriteString(s.Name)
		b.WriteString("](")
		b.WriteString(serverStatusRel(s.Name))
		b.WriteString(") | ")
		b.WriteString(mdCell(orUnknown(s.Lifecycle)))
		b.WriteString(" | ")
		b.WriteString(mdCell(orUnknown(s.Power)))
		b.WriteString(" | ")
		b.WriteString(mdCell(s.Health))
		b.WriteString(" | ")
		b.WriteString(mdCell(s.Profile))
		b.WriteString(" | ")
		b.WriteString(mdCell(truncate(conditionSummary(s.Conditions), 120)))
		b.WriteString(" | ")
		b.WriteString(mdCell(truncate(redact.String(s.LastError), 80)))
		b.WriteString(" |\n")
	}
	if n > readmeMaxRows {
		fmt.Fprintf(b, "\n… and %d more.\n", n-readmeMaxRows)
	}
	if n > 0 {
		b.WriteByte('\n')
	}
}

// conditionSummary lists the conditions that need attention: Stalled or
// any other whose Status is not the healthy one ("True" for Ready-like
// types, "False" for Stalled/Degraded).
func conditionSummary(cs []Condition) string {
	var out []string
	for _, c := range cs {
		// Ready, Progressing and BMCReachable are good when True; every other type
		// (Stalled, Orphaned, Waiting, WipeFailed, NoBMC...) says something
		// needs a look when True.
		positive := c.Type == "Ready" || c.Type == "Progressing" || c.Type == "BMCReachable"
		bad := positive && c.Status != "True" || !positive && c.Status == "True"
		if bad {
			s := c.Type + "=" + c.Status
			if c.Reason != "" {
				s += " (" + c.Reason + ")"
			}
			out = append(out, s)
		}
	}
	slices.Sort(out)
	return strings.Join(out, ", ")
}

// mdCell makes s safe inside a Markdown table cell or a paragraph of
// status/README.md (plan.MarkdownText, shared with the plan's
// pull-request comments).
func mdCell(s string) string { return plan.MarkdownText(s) }

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n - 1
	for cut > 0 && (s[cut]&0xC0) == 0x80 {
		cut--
	}
	return s[:cut] + "…"
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}

func shortID(c string) string {
	if len(c) > 12 {
		return c[:12]
	}
	return c
}

func sortedStrings(v []string) []string {
	out := slices.Clone(v)
	slices.Sort(out)
	return out
}

// errorsCount is "1 error" or "N errors".
func errorsCount(n int) string { return count(n, "error", "errors") }

// count is n and the noun: "1 step", "0 steps", "2 entries".
func count(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return strconv.Itoa(n) + " " + many
}
