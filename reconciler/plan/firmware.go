package plan

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/state"
)

// Condition types of a profile's firmware block on one server. Each is
// raised only on a server the profile applies to (pinned to it, or
// allocated or deployed with it); a refusal keeps the server from being
// deployed and nothing of the firmware block is sent to its BMC.
const (
	// CondFirmwareUnsupported: the server cannot get the profile's
	// firmware state: its BMC is IPMI (no BIOS attribute, volume,
	// firmware inventory or Secure Boot model), it has no BMC, or its
	// Redfish BMC has no resource for an area the profile names. Reason
	// IPMI, NoBMC or AreaMissing.
	CondFirmwareUnsupported = "FirmwareUnsupported"
	// CondFirmwareSettingInvalid: a BIOS setting the machine's attribute
	// registry refuses. Reason UnknownAttribute, WrongType, NotInList,
	// OutOfRange or ReadOnly; the message names the allowed values.
	CondFirmwareSettingInvalid = "FirmwareSettingInvalid"
	// CondFirmwareRAIDInvalid: a RAID volume the machine's controllers
	// cannot hold. Reason NoController, LevelNotSupported,
	// NotEnoughDrives, TooLarge or VolumeDiffers.
	CondFirmwareRAIDInvalid = "FirmwareRAIDInvalid"
	// CondFirmwareVersionInvalid: a component the firmware inventory
	// does not list, or lists as not updateable. Reason UnknownComponent
	// or NotUpdateable.
	CondFirmwareVersionInvalid = "FirmwareVersionInvalid"
	// CondFirmwareNotRead: the profile names firmware state and the
	// server's firmware has not been read yet, so nothing can be checked
	// (a Waiting condition; no refusal).
	CondFirmwareNotRead = "FirmwareNotRead"
)

// Kinds of FirmwareChange, named as `machinactl plan` prints them.
const (
	FirmwareBIOSSet       = "bios-set"
	FirmwareRAIDCreate    = "raid-create"
	FirmwareUpdate        = "firmware-update"
	FirmwareSecureBootSet = "secureboot-set"
)

// FirmwareChange is one difference between a profile's firmware block and
// what a server's BMC reported: what the firmware step would change.
type FirmwareChange struct {
	Server string `json:"server"`
	// Kind is FirmwareBIOSSet, FirmwareRAIDCreate, FirmwareUpdate or
	// FirmwareSecureBootSet.
	Kind string `json:"kind"`
	// Item is the attribute, volume or component name ("" for Secure
	// Boot).
	Item string `json:"item,omitempty"`
	// From is the value read ("" for a volume that does not exist); To
	// the value wanted (for a volume: level, drives and controller).
	From string `json:"from"`
	To   string `json:"to"`
	// Controller, Drives, Level and SizeBytes are a raid-create's
	// placement (SizeBytes 0: all of the drives); Image is a
	// firmware-update's entry of the firmware catalog (images.yaml
	// firmware) and Checksum its "sha256:" digest there, which the
	// served file is checked against before the BMC is offered it.
	Controller string   `json:"controller,omitempty"`
	Drives     []string `json:"drives,omitempty"`
	Level      string   `json:"level,omitempty"`
	SizeBytes  int64    `json:"sizeBytes,omitempty"`
	Image      string   `json:"image,omitempty"`
	Checksum   string   `json:"checksum,omitempty"`
	// Held: the server is deployed, so the change waits for `machinactl
	// approve` like other held steps; false: it applies before the image
	// is written.
	Held bool `json:"held,omitempty"`
}

// String renders c as `machinactl plan` prints it, e.g.
// "bios-set r1-n01 ProcVirtualization Disabled -> Enabled".
func (c FirmwareChange) String() string {
	s := c.Kind + " " + c.Server
	if c.Item != "" {
		s += " " + c.Item
	}
	from := c.From
	if from == "" {
		from = "(none)"
	}
	s += " " + from + " -> " + c.To
	if c.Held {
		s += " (held: deployed; applies after machinactl approve)"
	}
	return s
}

// FirmwareCheck is the outcome of checking one profile's firmware block
// against one server's firmware read: the changes it would make and the
// conditions that refuse it. Pure.
type FirmwareCheck struct {
	Changes []FirmwareChange
	// Refusals are FirmwareUnsupported/…Invalid conditions; any refusal
	// means nothing of the block may be sent.
	Refusals []Condition
	// NotRead: the firmware was never read, nothing could be checked.
	NotRead bool
}

// CheckFirmware checks fw (a profile's firmware block, nil for none)
// against what the controller read of server ws through its BMC (obs.Firmware).
// Settings are checked against the server's AttributeRegistry as a
// Redfish BMC checks a PATCH to its Bios settings object (unknown
// attribute, wrong type, Enumeration value not listed, Integer or String
// length out of bounds, read-only); RAID volumes against the controllers'
// levels and free drives; versions against the firmware inventory.
//
// want is the inventory the profile is from (it resolves a version's
// firmware catalog entry to its checksum); nil leaves Checksum empty.
func CheckFirmware(want *inventory.Inventory, fw *inventory.Firmware, ws *inventory.Server, obs *state.Server) FirmwareCheck {
	var out FirmwareCheck
	if fw == nil {
		return out
	}
	subject := "server/" + ws.Name
	refuse := func(typ, reason, msg string) {
		out.Refusals = append(out.Refusals, Condition{Subject: subject, Type: typ, Reason: reason, Message: msg})
	}
	switch {
	case ws.BMC.IsZero():
		refuse(CondFirmwareUnsupported, "NoBMC", "the profile sets firmware state and the server has no BMC to set it through")
		return out
	case ws.BMC.Driver == inventory.DriverIPMI:
		refuse(CondFirmwareUnsupported, "IPMI", "the profile sets firmware state ("+strings.Join(firmwareAreas(fw), ", ")+") and the server's BMC is IPMI, which has no BIOS attribute, RAID volume, firmware inventory or Secure Boot interface: not deployed with this profile")
		return out
	}
	read := obs.Firmware
	if read == nil {
		out.NotRead = true
		return out
	}
	for _, area := range firmwareAreas(fw) {
		if why, ok := read.Unsupported[area]; ok {
			refuse(CondFirmwareUnsupported, "AreaMissing", fmt.Sprintf("the profile sets firmware %s and the BMC cannot: %s", area, why))
		}
	}
	if len(out.Refusals) > 0 {
		return out
	}
	add := func(kind, item, from, to string) {
		out.Changes = append(out.Changes, FirmwareChange{Server: ws.Name, Kind: kind, Item: item, From: from, To: to})
	}
	if len(fw.Settings) > 0 && read.BIOS != nil {
		for _, name := range sortedKeys(fw.Settings) {
			want := normValue(fw.Settings[name])
			if reason, msg := checkSetting(read.BIOS.Registry, name, want); reason != "" {
				refuse(CondFirmwareSettingInvalid, reason, msg)
				continue
			}
			cur, known := read.BIOS.Attributes.Get(name)
			if pend, ok := read.BIOS.Pending[name]; ok {
				cur, known = pend, true
			}
			if known && normValue(cur) == want {
				continue
			}
			from := ""
			if known {
				from = showValue(cur)
			}
			add(FirmwareBIOSSet, name, from, showValue(want))
		}
	}
	raidChanges(fw.RAID, read.Storage, refuse, func(c FirmwareChange) {
		c.Server = ws.Name
		out.Changes = append(out.Changes, c)
	})
	for _, v := range fw.Versions {
		c := findComponent(read.Components, v.Component)
		switch {
		case c == nil:
			refuse(CondFirmwareVersionInvalid, "UnknownComponent", fmt.Sprintf("component %s is not in the firmware inventory (it lists: %s)", v.Component, orNone(strings.Join(componentNames(read.Components), ", "))))
		case c.Version == v.Version:
		case !c.Updateable:
			refuse(CondFirmwareVersionInvalid, "NotUpdateable", fmt.Sprintf("component %s runs %s and the BMC says it is not updateable (profile wants %s)", v.Component, c.Version, v.Version))
		default:
			img, sum := firmwareImage(want, v)
			out.Changes = append(out.Changes, FirmwareChange{Server: ws.Name, Kind: FirmwareUpdate, Item: v.Component, From: c.Version, To: v.Version,
				Image: img, Checksum: sum})
		}
	}
	if fw.SecureBoot != nil && read.SecureBoot != nil && read.SecureBoot.Enable != *fw.SecureBoot {
		add(FirmwareSecureBootSet, "", strconv.FormatBool(read.SecureBoot.Enable), strconv.FormatBool(*fw.SecureBoot))
	}
	if len(out.Refusals) > 0 {
		out.Changes = nil // nothing of a refused block is planned
	}
	return out
}

// firmwareImage is v's entry of the firmware catalog (images.yaml's
// firmware list): its name and checksum, "" when want is nil or lacks it
// (validate refuses a version naming no entry).
func firmwareImage(want *inventory.Inventory, v inventory.FirmwareVersion) (name, checksum string) {
	if want == nil {
		return v.Image, ""
	}
	if fi := want.FirmwareImage(v.Image); fi != nil {
		return fi.Name, fi.Checksum
	}
	return v.Image, ""
}

// firmwareAreas lists the areas (state.FirmwareArea*) fw names.
func firmwareAreas(fw *inventory.Firmware) []string {
	var a []string
	if len(fw.Settings) > 0 {
		a = append(a, state.FirmwareAreaBIOS)
	}
	if len(fw.RAID) > 0 {
		a = append(a, state.FirmwareAreaRAID)
	}
	if len(fw.Versions) > 0 {
		a = append(a, state.FirmwareAreaVersions)
	}
	if fw.SecureBoot != nil {
		a = append(a, state.FirmwareAreaSecureBoot)
	}
	return a
}

// normValue turns an integral float64 (what JSON and YAML decoding give
// for numbers) into int64, as the bmc contract's NormalizeValue does, so
// a profile's 0 equals a BMC's 0.
func normValue(v any) any {
	switch x := v.(type) {
	case float64:
		if x == math.Trunc(x) && math.Abs(x) < 1<<53 {
			return int64(x)
		}
	case int:
		return int64(x)
	}
	return v
}

func showValue(v any) string {
	if v == nil {
		return "(unset)"
	}
	return fmt.Sprint(normValue(v))
}

// checkSetting checks one setting against the registry (nil: the BMC
// publishes none, so only the BMC can judge; accepted). It returns the
// refusal's reason and message, or "".
func checkSetting(reg []state.BIOSAttribute, name string, v any) (reason, msg string) {
	if reg == nil {
		return "", ""
	}
	i := sort.Search(len(reg), func(i int) bool { return reg[i].Name >= name })
	if i == len(reg) || reg[i].Name != name {
		return "UnknownAttribute", fmt.Sprintf("BIOS attribute %s is not in the machine's attribute registry", name)
	}
	a := reg[i]
	if a.ReadOnly {
		return "ReadOnly", fmt.Sprintf("BIOS attribute %s is read-only", name)
	}
	allowed := attrAllowed(a)
	bad := func(reason, what string) (string, string) {
		return reason, fmt.Sprintf("BIOS attribute %s: %s (allowed: %s)", name, what, allowed)
	}
	switch a.Type {
	case "Enumeration":
		s, ok := v.(string)
		if !ok {
			return bad("WrongType", fmt.Sprintf("value %v is not of type Enumeration", v))
		}
		if !slices.Contains(a.Values, s) {
			return bad("NotInList", fmt.Sprintf("value %q not allowed", s))
		}
	case "String", "Password":
		s, ok := v.(string)
		if !ok {
			return bad("WrongType", fmt.Sprintf("value %v is not of type %s", v, a.Type))
		}
		if n := int64(len([]rune(s))); (a.Min != nil && n < *a.Min) || (a.Max != nil && n > *a.Max) {
			return bad("OutOfRange", fmt.Sprintf("value of length %d out of range", n))
		}
	case "Integer":
		n, ok := v.(int64)
		if !ok {
			return bad("WrongType", fmt.Sprintf("value %v is not of type Integer", v))
		}
		if (a.Min != nil && n < *a.Min) || (a.Max != nil && n > *a.Max) {
			return bad("OutOfRange", fmt.Sprintf("value %d out of range", n))
		}
	case "Boolean":
		if _, ok := v.(bool); !ok {
			return bad("WrongType", fmt.Sprintf("value %v is not of type Boolean", v))
		}
	}
	return "", ""
}

// attrAllowed says what a registry attribute accepts, as the refusal
// names it: the Enumeration values, an Integer's range, a String's
// length, or the type.
func attrAllowed(a state.BIOSAttribute) string {
	bound := func(p *int64, def string) string {
		if p == nil {
			return def
		}
		return strconv.FormatInt(*p, 10)
	}
	switch a.Type {
	case "Enumeration":
		return strings.Join(a.Values, ", ")
	case "Integer":
		if a.Min == nil && a.Max == nil {
			return "any integer"
		}
		return bound(a.Min, "") + ".." + bound(a.Max, "")
	case "String", "Password":
		if a.Min == nil && a.Max == nil {
			return "any string"
		}
		return "a string of length " + bound(a.Min, "0") + ".." + bound(a.Max, "")
	case "Boolean":
		return "true, false"
	}
	return a.Type
}

func findComponent(cs []state.FirmwareComponent, name string) *state.FirmwareComponent {
	for i := range cs {
		if cs[i].ID == name {
			return &cs[i]
		}
	}
	for i := range cs {
		if strings.EqualFold(cs[i].Name, name) {
			return &cs[i]
		}
	}
	return nil
}

func componentNames(cs []state.FirmwareComponent) []string {
	var out []string
	for _, c := range cs {
		n := c.ID
		if c.Name != "" && c.Name != c.ID {
			n += " (" + c.Name + ")"
		}
		out = append(out, n)
	}
	return out
}

// raidUsableDrives is how many drives' capacity a level's volume offers
// over n member drives (SNIA DDF 2.0 §4.2).
func raidUsableDrives(level string, n int) int {
	switch level {
	case inventory.RAID1:
		return 1
	case inventory.RAID5:
		return n - 1
	case inventory.RAID6:
		return n - 2
	case inventory.RAID10:
		return n / 2
	}
	return n
}

// raidChanges plans each wanted volume: one that exists by name must
// have the level asked for; a new one needs a controller that can create
// volumes of its level with enough free drives (in no volume, not taken
// by an earlier volume of the profile) of its media type and size. Drives
// are taken smallest first, then by ID.
func raidChanges(want []inventory.RAIDVolume, ctrls []state.StorageController, refuse func(typ, reason, msg string), add func(FirmwareChange)) {
	if len(want) == 0 {
		return
	}
	taken := map[string]bool{}
	for _, c := range ctrls {
		for _, v := range c.Volumes {
			for _, d := range v.Drives {
				taken[c.ID+"/"+d] = true
			}
		}
	}
	for _, v := range want {
		if c, have := findVolume(ctrls, v.Name); have != nil {
			if have.RAIDType != "" && have.RAIDType != v.Level {
				refuse(CondFirmwareRAIDInvalid, "VolumeDiffers", fmt.Sprintf("volume %s exists on %s as %s; the profile wants %s (Machina does not change a volume it finds: delete or rename it)", v.Name, c, have.RAIDType, v.Level))
			}
			continue
		}
		why, placed := "", false
		for _, c := range ctrls {
			if !c.CanCreateVolumes {
				continue
			}
			if len(c.RAIDTypes) > 0 && !slices.Contains(c.RAIDTypes, v.Level) {
				why = fmt.Sprintf("LevelNotSupported|controller %s cannot create %s (it supports %s)", c.ID, v.Level, strings.Join(c.RAIDTypes, ", "))
				continue
			}
			var free []state.StorageDrive
			for _, d := range c.Drives {
				if taken[c.ID+"/"+d.ID] || (v.Drives.MediaType != "" && d.MediaType != v.Drives.MediaType) || d.CapacityBytes < v.Drives.MinSizeGiB<<30 {
					continue
				}
				free = append(free, d)
			}
			if len(free) < v.Drives.Count {
				why = fmt.Sprintf("NotEnoughDrives|controller %s has %d free drives%s; volume %s needs %d", c.ID, len(free), driveFilter(v.Drives), v.Name, v.Drives.Count)
				continue
			}
			sort.SliceStable(free, func(i, j int) bool {
				if free[i].CapacityBytes != free[j].CapacityBytes {
					return free[i].CapacityBytes < free[j].CapacityBytes
				}
				return free[i].ID < free[j].ID
			})
			free = free[:v.Drives.Count]
			usable := int64(raidUsableDrives(v.Level, len(free))) * free[0].CapacityBytes
			if size := v.SizeBytes(); size > usable {
				why = fmt.Sprintf("TooLarge|volume %s asks %s; %s over %d drives of controller %s offers %d GiB", v.Name, v.Size, v.Level, len(free), c.ID, usable>>30)
				continue
			}
			ids := make([]string, len(free))
			for i, d := range free {
				ids[i] = d.ID
				taken[c.ID+"/"+d.ID] = true
			}
			add(FirmwareChange{Kind: FirmwareRAIDCreate, Item: v.Name, To: fmt.Sprintf("%s %s on %s (%s)", v.Level, v.Size, c.ID, strings.Join(ids, ", ")),
				Controller: c.ID, Drives: ids, Level: v.Level, SizeBytes: v.SizeBytes()})
			placed = true
			break
		}
		if placed {
			continue
		}
		if why == "" {
			why = fmt.Sprintf("NoController|no storage controller of the machine can create volumes (volume %s)", v.Name)
		}
		reason, msg, _ := strings.Cut(why, "|")
		refuse(CondFirmwareRAIDInvalid, reason, msg)
	}
}

func driveFilter(d inventory.DriveSelector) string {
	var f []string
	if d.MediaType != "" {
		f = append(f, d.MediaType)
	}
	if d.MinSizeGiB > 0 {
		f = append(f, fmt.Sprintf("at least %d GiB", d.MinSizeGiB))
	}
	if len(f) == 0 {
		return ""
	}
	return " (" + strings.Join(f, ", ") + ")"
}

func findVolume(ctrls []state.StorageController, name string) (string, *state.Volume) {
	for _, c := range ctrls {
		for i := range c.Volumes {
			if c.Volumes[i].Name == name {
				return c.ID, &c.Volumes[i]
			}
		}
	}
	return "", nil
}

// firmwareProfile returns the profile whose firmware block applies to
// the server: the one it is allocated or deployed with, else the one
// servers.yaml pins; "" for none.
func firmwareProfile(ws *inventory.Server, obs *state.Server) string {
	if obs != nil && obs.Allocation != nil && obs.Allocation.Profile != "" {
		return obs.Allocation.Profile
	}
	return ws.Profile
}

// firmware checks every server a profile with a firmware block applies
// to (allocated or deployed with it, pinned to it, or allocated to it in
// this plan). A refusal becomes a condition and drops the server's
// deploy: nothing is sent to its BMC. On a server not deployed yet, a
// difference (or a firmware never read) replaces this pass's deploy: an
// allocated server gets ActFirmware, which applies the block and reads it
// back, and the deploy follows once the read-back matches. On a deployed
// server a difference (a profile changed after its deploy) needs a reset
// of the running host: its ActFirmware is held (p.fwHeld, applyBrake)
// and its changes listed as held, until the operator approves the
// revision; then the step runs.
func (p *planning) firmware() {
	if !anyProfile(p.want, func(pr *inventory.Profile) bool { return pr.Firmware != nil }) {
		return // every server below would be skipped: no profile sets firmware
	}
	blocked := map[string]Condition{}
	for i := range p.want.Servers {
		ws := &p.want.Servers[i]
		if ws.Want == inventory.WantRetired {
			continue
		}
		obs, ok := p.have.Servers[ws.Name]
		if !ok || obs.Lifecycle == state.LifecycleRetired {
			continue
		}
		name := firmwareProfile(ws, obs)
		if planned, ok := p.allocated[ws.Name]; ok {
			name = planned
		}
		prof := p.want.Profile(name)
		if prof == nil || prof.Firmware == nil {
			continue
		}
		chk := CheckFirmware(p.want, prof.Firmware, ws, obs)
		for _, c := range chk.Refusals {
			c.Message = "profile " + prof.Name + ": " + c.Message
			p.cond(c)
			blocked[ws.Name] = c
		}
		if len(chk.Refusals) > 0 {
			continue
		}
		if chk.NotRead {
			p.cond(Condition{Subject: "server/" + ws.Name, Type: CondFirmwareNotRead, Reason: "Waiting",
				Message: "profile " + prof.Name + " sets firmware state; the server's firmware has not been read from its BMC yet"})
		}
		deployed := obs.Lifecycle == state.LifecycleDeployed
		held := deployed && !p.opts.Approved
		for _, c := range chk.Changes {
			c.Held = held
			p.res.Firmware = append(p.res.Firmware, c)
		}
		if deployed {
			// Applying resets a running host: only once the operator
			// approves this revision (machinactl approve), as the safety
			// brake's holds. Never-read firmware is read by the sweep.
			if len(chk.Changes) > 0 && !hasServerStep(p.res.Steps, ws.Name, ActRelease) && !hasServerStep(p.res.Steps, ws.Name, ActRetire) {
				st := Step{Server: ws.Name, Action: ActFirmware, Profile: prof.Name,
					Why: fmt.Sprintf("profile %s firmware: %d changes on a deployed server (resets its host)", prof.Name, len(chk.Changes))}
				if held {
					p.fwHeld = append(p.fwHeld, st)
				} else {
					p.res.Steps = append(p.res.Steps, st)
				}
			}
			continue
		}
		if len(chk.Changes) == 0 && !chk.NotRead {
			continue
		}
		switch obs.Lifecycle {
		case state.LifecycleReady, state.LifecycleAllocated:
			blocked[ws.Name] = Condition{}
		}
		if obs.Lifecycle == state.LifecycleAllocated && !hasServerStep(p.res.Steps, ws.Name, ActRelease) {
			why := fmt.Sprintf("profile %s firmware: %d changes before the image is written", prof.Name, len(chk.Changes))
			if chk.NotRead {
				why = fmt.Sprintf("profile %s firmware: read and apply before the image is written", prof.Name)
			}
			p.res.Steps = append(p.res.Steps, Step{Server: ws.Name, Action: ActFirmware, Profile: prof.Name, Why: why})
		}
	}
	sort.SliceStable(p.res.Firmware, func(i, j int) bool { return p.res.Firmware[i].Server < p.res.Firmware[j].Server })
	if len(blocked) > 0 {
		p.res.Steps = dropDeploys(p.res.Steps, blocked)
		p.disruptive = dropDeploys(p.disruptive, blocked)
	}
}

func hasServerStep(steps []Step, server string, a Action) bool {
	for _, s := range steps {
		if s.Server == server && s.Action == a {
			return true
		}
	}
	return false
}

// firmwareRefused reports whether profile pr's firmware block is refused
// on server ws (Candidates skips such servers).
func firmwareRefused(want *inventory.Inventory, pr *inventory.Profile, ws *inventory.Server, obs *state.Server) bool {
	return pr.Firmware != nil && len(CheckFirmware(want, pr.Firmware, ws, obs).Refusals) > 0
}

// dropDeploys removes the ActDeploy steps of the named servers.
func dropDeploys(steps []Step, names map[string]Condition) []Step {
	out := steps[:0:0]
	for _, s := range steps {
		if _, bad := names[s.Server]; bad && s.Action == ActDeploy {
			continue
		}
		out = append(out, s)
	}
	return out
}
