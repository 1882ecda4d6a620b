package redfish

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/machina-metal/machina/bmc"
)

// Read-model section names used in bmc.Info.Missing.
const (
	SectionIdentity     = "identity"
	SectionHealth       = "health"
	SectionTemperatures = "temperatures"
	SectionPower        = "power"
	SectionFirmware     = "firmware"
	SectionLogs         = "logs"
	SectionNICs         = "nics"
)

// Info returns the read model: identity (Manufacturer, Model, SerialNumber,
// UUID, BiosVersion; the managing Manager's FirmwareVersion),
// Status.HealthRollup (or Health), EthernetInterfaces MACs (without the
// BMC's own host-interface NIC, Id ToManager or Links.HostInterface),
// temperatures and power draw, UpdateService FirmwareInventory versions,
// and the newest Config.LogEntries log entries.
//
// Readings come only from the chassis the System links to (Links.Chassis;
// the Chassis collection's only member when it links none) and logs only
// from the System and the Managers in its Links.ManagedBy (the only
// Manager when it names none). Temperatures are read from the current
// model first: the chassis' Sensors (ReadingType Temperature, with
// health), then ThermalSubsystem/ThermalMetrics, then the deprecated
// Thermal; power from EnvironmentMetrics.PowerWatts, then the deprecated
// Power.PowerControl. In a chassis shared by several Systems, a reading
// whose RelatedItem names only another System is left out and named in
// Info.Untied; in a chassis serving one System every reading is kept,
// even where RelatedItem names a System path that does not exist. A section the BMC does not report is named in Missing;
// only failing to read the System itself is an error. A health other than
// OK is logged at Warn; recording it is the caller's job (the controller's
// BMC sweep stores it with Store.ObserveBMC, which writes an EventHealth
// event on every change).
func (d *Driver) Info(ctx context.Context) (_ *bmc.Info, err error) {
	defer func() { err = bmc.WithBMC(d.cfg.Endpoint, err) }()
	d.conn.beginOp()
	sp, sys, err := d.system(ctx, "info")
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	root := d.root
	d.mu.Unlock()
	in := &bmc.Info{Power: powerOf(sys)}
	miss := func(s string) { in.Missing = append(in.Missing, s) }
	in.Manufacturer, in.Model = strv(sys, "Manufacturer"), strv(sys, "Model")
	in.Serial, in.UUID, in.BIOSVersion = strv(sys, "SerialNumber"), strv(sys, "UUID"), strv(sys, "BiosVersion")
	managers := d.linked(ctx, sys, "ManagedBy", link(root, "Managers"))
	if len(managers) > 0 {
		in.BMCFirmware = strv(managers[0], "FirmwareVersion")
	}
	if in.Manufacturer == "" && in.Model == "" && in.Serial == "" && in.UUID == "" {
		miss(SectionIdentity)
	}
	st := obj(sys, "Status")
	in.Health = strv(st, "HealthRollup")
	if in.Health == "" {
		in.Health = strv(st, "Health")
	}
	if in.Health == "" {
		miss(SectionHealth)
	} else if in.Health != "OK" {
		d.cfg.Logger.Warn("redfish health not OK", "health", in.Health)
	}
	in.NICMACs = d.nics(ctx, sys)
	if len(in.NICMACs) == 0 {
		miss(SectionNICs)
	}
	chassis := d.linked(ctx, sys, "Chassis", link(root, "Chassis"))
	var nSystems int // members of the Systems collection, read once if a chassis names none
	for _, ch := range chassis {
		if len(anySliceOf(obj(ch, "Links")["ComputerSystems"])) == 0 && nSystems == 0 {
			nSystems = len(members(d.tryGet(ctx, link(root, "Systems"))))
		}
		ts, untied := d.temperatures(ctx, ch, sp, servesOne(ch, nSystems))
		in.Temperatures = append(in.Temperatures, ts...)
		in.Untied = append(in.Untied, untied...)
	}
	if len(in.Temperatures) == 0 {
		miss(SectionTemperatures)
	}
	for _, ch := range chassis {
		if in.PowerWatts = d.powerDraw(ctx, ch); in.PowerWatts != nil {
			break
		}
	}
	if in.PowerWatts == nil {
		miss(SectionPower)
	}
	in.Firmware = d.firmware(ctx, root)
	if len(in.Firmware) == 0 {
		miss(SectionFirmware)
	}
	in.Logs = d.logs(ctx, sys, managers)
	if len(in.Logs) == 0 {
		miss(SectionLogs)
	}
	return in, nil
}

// linked reads the resources the System names in Links.<key> (Chassis,
// ManagedBy); when it names none, the only member of coll, if it has
// exactly one (a BMC serving several leaves nothing to tie to).
func (d *Driver) linked(ctx context.Context, sys map[string]any, key, coll string) []map[string]any {
	var out []map[string]any
	if ls, ok := obj(sys, "Links")[key].([]any); ok && len(ls) > 0 {
		for _, l := range ls {
			if m, ok := l.(map[string]any); ok {
				if b := d.tryGet(ctx, strv(m, "@odata.id")); b != nil {
					out = append(out, b)
				}
			}
		}
		return out
	}
	if ms := members(d.tryGet(ctx, coll)); len(ms) == 1 {
		if b := d.tryGet(ctx, ms[0]); b != nil {
			out = append(out, b)
		}
	}
	return out
}

// servesOne reports whether chassis serves exactly one System: its
// Links.ComputerSystems names one, or it names none and the BMC's Systems
// collection has nSystems == 1 member. Every reading of such a chassis is
// that System's, whatever its RelatedItem says: BMCs that fill RelatedItem
// with a wrong or stale System path (a renamed Id, a missing
// /redfish/v1 prefix, the collection itself) must not lose every reading.
func servesOne(chassis map[string]any, nSystems int) bool {
	if cs := anySliceOf(obj(chassis, "Links")["ComputerSystems"]); len(cs) > 0 {
		return len(cs) == 1
	}
	return nSystems == 1
}

// tiedTo reports whether a reading with RelatedItem items belongs to the
// System at sysPath: no item names a System (a chassis-level reading of a
// chassis the System links to), or one names this System or something
// under it.
func tiedTo(items []any, sysPath string) bool {
	sysPath = strings.TrimRight(sysPath, "/")
	namesSystem := false
	for _, it := range items {
		id := strings.TrimRight(strv(asMap(it), "@odata.id"), "/")
		if !strings.HasPrefix(strings.ToLower(id), "/redfish/v1/systems/") {
			continue
		}
		namesSystem = true
		if strings.EqualFold(id, sysPath) || strings.HasPrefix(strings.ToLower(id), strings.ToLower(sysPath)+"/") {
			return true
		}
	}
	return !namesSystem
}

func asMap(v any) map[string]any { m, _ := v.(map[string]any); return m }

// tryGet reads p for the read model: any error (404, wrong body) is nil.
func (d *Driver) tryGet(ctx context.Context, p string) map[string]any {
	if p == "" {
		return nil
	}
	b, err := d.get(ctx, "info", p)
	if err != nil {
		var be *bmc.BMCError
		if !errors.As(err, &be) || be.Status != http.StatusNotFound {
			d.cfg.Logger.Debug("redfish info: read failed", "path", p, "err", err)
		}
		return nil
	}
	return b
}

func (d *Driver) nics(ctx context.Context, sys map[string]any) []string {
	var out []string
	for _, m := range members(d.tryGet(ctx, link(sys, "EthernetInterfaces"))) {
		b := d.tryGet(ctx, m)
		if strv(b, "Id") == "ToManager" || link(obj(b, "Links"), "HostInterface") != "" {
			continue // the BMC's host interface (Redfish HostInterface), not a system NIC
		}
		mac := normMAC(strv(b, "MACAddress"))
		if mac == "" {
			mac = normMAC(strv(b, "PermanentMACAddress"))
		}
		if mac != "" && !slices.Contains(out, mac) {
			out = append(out, mac)
		}
	}
	return out
}

// maxSensors caps the Sensor resources read per chassis.
const maxSensors = 128

// temperatures reads one chassis' temperatures, current model first, and
// names the readings left out as another System's. one says the chassis
// serves only this System (see servesOne): then RelatedItem is not
// consulted and no reading is left out.
func (d *Driver) temperatures(ctx context.Context, chassis map[string]any, sysPath string, one bool) (out []bmc.Temperature, untied []string) {
	cid := strv(chassis, "@odata.id")
	keep := func(t bmc.Temperature, related []any, src string) {
		if one || tiedTo(related, sysPath) {
			out = append(out, t)
		} else {
			untied = append(untied, fmt.Sprintf("temperature %q (%s): tied to another system", t.Name, src))
		}
	}
	// Sensors (Redfish 2020.4+): ReadingType Temperature, with health.
	for i, m := range members(d.tryGet(ctx, link(chassis, "Sensors"))) {
		if i >= maxSensors {
			break
		}
		sn := d.tryGet(ctx, m)
		if (strv(sn, "ReadingType") != "Temperature" && strv(sn, "ReadingUnits") != "Cel") || strv(obj(sn, "Status"), "State") == "Absent" {
			continue
		}
		c, ok := num(sn, "Reading")
		if !ok {
			continue
		}
		rel, _ := sn["RelatedItem"].([]any)
		keep(bmc.Temperature{Name: strv(sn, "Name"), Celsius: c, Health: strv(obj(sn, "Status"), "Health")}, rel, m)
	}
	if len(out) > 0 || len(untied) > 0 {
		return out, untied
	}
	// ThermalSubsystem/ThermalMetrics.TemperatureReadingsCelsius; in a
	// chassis shared by several systems the source sensor says whose.
	shared := len(anySliceOf(obj(chassis, "Links")["ComputerSystems"])) > 1
	tm := d.tryGet(ctx, link(d.tryGet(ctx, link(chassis, "ThermalSubsystem")), "ThermalMetrics"))
	for _, t := range thermalMetricsFrom(tm) {
		var rel []any
		if shared && t.src != "" {
			rel, _ = d.tryGet(ctx, t.src)["RelatedItem"].([]any)
		}
		keep(t.Temperature, rel, cid+" ThermalMetrics")
	}
	if len(out) > 0 || len(untied) > 0 {
		return out, untied
	}
	// Deprecated Thermal.Temperatures[] (RelatedItem per entry).
	for _, t := range tempsFrom(d.tryGet(ctx, link(chassis, "Thermal"))) {
		keep(t.Temperature, t.related, cid+" Thermal")
	}
	return out, untied
}

func anySliceOf(v any) []any { s, _ := v.([]any); return s }

// reading is a temperature with where it came from.
type reading struct {
	bmc.Temperature
	src     string // DataSourceUri (ThermalMetrics)
	related []any  // RelatedItem (Thermal)
}

// thermalMetricsFrom reads ThermalMetrics.TemperatureReadingsCelsius[]
// (DeviceName, Reading, DataSourceUri); non-numeric readings are skipped.
func thermalMetricsFrom(tm map[string]any) []reading {
	rs, _ := tm["TemperatureReadingsCelsius"].([]any)
	var out []reading
	for _, r := range rs {
		m, _ := r.(map[string]any)
		c, ok := num(m, "Reading")
		if !ok {
			continue
		}
		out = append(out, reading{Temperature: bmc.Temperature{Name: strv(m, "DeviceName"), Celsius: c}, src: strv(m, "DataSourceUri")})
	}
	return out
}

// tempsFrom reads Thermal.Temperatures[].ReadingCelsius; readings that are
// not numbers (null, missing, "N/A") are skipped, and so are sensors whose
// Status.State is "Absent" (Redfish Resource.State: the sensor is not
// populated; HPE iLO 5 reports those with ReadingCelsius 0).
func tempsFrom(th map[string]any) []reading {
	ts, _ := th["Temperatures"].([]any)
	var out []reading
	for _, t := range ts {
		m, _ := t.(map[string]any)
		if strv(obj(m, "Status"), "State") == "Absent" {
			continue
		}
		c, ok := num(m, "ReadingCelsius")
		if !ok {
			continue // "N/A", null, absent: unknown
		}
		rel, _ := m["RelatedItem"].([]any)
		out = append(out, reading{Temperature: bmc.Temperature{Name: strv(m, "Name"), Celsius: c, Health: strv(obj(m, "Status"), "Health")}, related: rel})
	}
	return out
}

// powerDraw reads EnvironmentMetrics.PowerWatts.Reading (current model),
// else the deprecated Power.PowerControl[0].PowerConsumedWatts.
func (d *Driver) powerDraw(ctx context.Context, chassis map[string]any) *float64 {
	if w := envWatts(d.tryGet(ctx, link(chassis, "EnvironmentMetrics"))); w != nil {
		return w
	}
	return powerControlWatts(d.tryGet(ctx, link(chassis, "Power")))
}

// powerControlWatts reads Power.PowerControl[0].PowerConsumedWatts.
func powerControlWatts(p map[string]any) *float64 {
	if pcs, ok := p["PowerControl"].([]any); ok && len(pcs) > 0 {
		if m, ok := pcs[0].(map[string]any); ok {
			if w, ok := num(m, "PowerConsumedWatts"); ok {
				return &w
			}
		}
	}
	return nil
}

// envWatts reads EnvironmentMetrics.PowerWatts.Reading.
func envWatts(em map[string]any) *float64 {
	if w, ok := num(obj(em, "PowerWatts"), "Reading"); ok {
		return &w
	}
	return nil
}

func (d *Driver) firmware(ctx context.Context, root map[string]any) []bmc.FirmwareEntry {
	us := d.tryGet(ctx, link(root, "UpdateService"))
	var out []bmc.FirmwareEntry
	for _, m := range members(d.tryGet(ctx, link(us, "FirmwareInventory"))) {
		if len(out) >= d.cfg.FirmwareLimit {
			break
		}
		b := d.tryGet(ctx, m)
		if v := strv(b, "Version"); v != "" {
			name := strv(b, "Name")
			if name == "" {
				name = strv(b, "Id")
			}
			out = append(out, bmc.FirmwareEntry{Name: name, Version: v})
		}
	}
	return out
}

// logs reads the first log service with entries, the System's LogServices
// first, then those of the Managers that manage it.
func (d *Driver) logs(ctx context.Context, sys map[string]any, managers []map[string]any) []bmc.LogEntry {
	services := []string{link(sys, "LogServices")}
	for _, m := range managers {
		services = append(services, link(m, "LogServices"))
	}
	seen := map[string]bool{}
	for _, coll := range services {
		if coll == "" || seen[coll] {
			continue
		}
		seen[coll] = true
		for _, ls := range members(d.tryGet(ctx, coll)) {
			entries := d.tryGet(ctx, link(d.tryGet(ctx, ls), "Entries"))
			if out := d.entries(ctx, entries); len(out) > 0 {
				return out
			}
		}
	}
	return nil
}

func (d *Driver) entries(ctx context.Context, coll map[string]any) []bmc.LogEntry {
	ms, _ := coll["Members"].([]any)
	var out []bmc.LogEntry
	for i, e := range ms {
		if i >= 200 {
			break
		}
		m, _ := e.(map[string]any)
		if _, inline := m["Message"]; !inline && len(m) <= 1 {
			m = d.tryGet(ctx, strv(m, "@odata.id"))
		}
		if e, ok := entryFrom(m); ok {
			out = append(out, e)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Created.After(out[j].Created) })
	if len(out) > d.cfg.LogEntries {
		out = out[:d.cfg.LogEntries]
	}
	return out
}

// entryFrom decodes one LogEntry; ok is false without a Message.
func entryFrom(m map[string]any) (bmc.LogEntry, bool) {
	msg := strv(m, "Message")
	if msg == "" {
		return bmc.LogEntry{}, false
	}
	return bmc.LogEntry{Created: parseTime(strv(m, "Created")), Severity: strv(m, "Severity"), Message: sanitize(msg)}, true
}

// parseTime parses Redfish DateTime leniently: RFC 3339, without a UTC
// offset (Dell job StartTime), or zero for "TIME_NA" and the like.
func parseTime(s string) time.Time {
	s = strings.TrimSpace(s)
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02T15:04:05", "2006-01-02T15:04:05Z0700", "2006-01-02 15:04:05"} {
		if t, err := time.Parse(layout, s); err == nil {
			return t.UTC()
		}
	}
	return time.Time{}
}

// Health implements bmc.HealthReader with one GET of the ComputerSystem:
// its PowerState and Status.HealthRollup (else Status.Health; "" when
// neither is reported). The caller records it (the controller's BMC
// sweep: Store.ObserveBMC, an EventHealth event on a change).
func (d *Driver) Health(ctx context.Context) (_ bmc.PowerState, _ string, err error) {
	defer func() { err = bmc.WithBMC(d.cfg.Endpoint, err) }()
	d.conn.beginOp()
	_, sys, err := d.system(ctx, "health")
	if err != nil {
		return bmc.PowerUnknown, "", err
	}
	st := obj(sys, "Status")
	h := strv(st, "HealthRollup")
	if h == "" {
		h = strv(st, "Health")
	}
	return powerOf(sys), h, nil
}
