package redfish

import (
	"context"
	"errors"
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
// UUID, BiosVersion; Manager FirmwareVersion), Status.HealthRollup (or
// Health), EthernetInterfaces MACs, Chassis Thermal temperatures (else
// ThermalSubsystem/ThermalMetrics), power draw
// from Power.PowerControl[0].PowerConsumedWatts or
// EnvironmentMetrics.PowerWatts.Reading, UpdateService FirmwareInventory
// versions, and the newest Config.LogEntries log entries. A section the BMC
// does not report, or reports with unusable types, is named in Missing; only
// failing to read the System itself is an error. A health other than OK is
// logged at Warn; recording it is the caller's job (the controller's BMC
// sweep stores it with Store.ObserveBMC, which writes an EventHealth event
// on every change).
func (d *Driver) Info(ctx context.Context) (*bmc.Info, error) {
	_, sys, err := d.system(ctx, "info")
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
	if mgr := d.firstMember(ctx, link(root, "Managers")); mgr != nil {
		in.BMCFirmware = strv(mgr, "FirmwareVersion")
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
	chassis := d.chassis(ctx, sys, root)
	in.Temperatures = d.temperatures(ctx, chassis)
	if len(in.Temperatures) == 0 {
		miss(SectionTemperatures)
	}
	in.PowerWatts = d.powerDraw(ctx, chassis)
	if in.PowerWatts == nil {
		miss(SectionPower)
	}
	in.Firmware = d.firmware(ctx, root)
	if len(in.Firmware) == 0 {
		miss(SectionFirmware)
	}
	in.Logs = d.logs(ctx, sys, root)
	if len(in.Logs) == 0 {
		miss(SectionLogs)
	}
	return in, nil
}

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

func (d *Driver) firstMember(ctx context.Context, coll string) map[string]any {
	c := d.tryGet(ctx, coll)
	for _, m := range members(c) {
		if b := d.tryGet(ctx, m); b != nil {
			return b
		}
	}
	return nil
}

func (d *Driver) nics(ctx context.Context, sys map[string]any) []string {
	var out []string
	for _, m := range members(d.tryGet(ctx, link(sys, "EthernetInterfaces"))) {
		b := d.tryGet(ctx, m)
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

// chassis returns the System's first Links.Chassis, else the first member
// of the Chassis collection.
func (d *Driver) chassis(ctx context.Context, sys, root map[string]any) map[string]any {
	if cs, ok := obj(sys, "Links")["Chassis"].([]any); ok {
		for _, c := range cs {
			if m, ok := c.(map[string]any); ok {
				if b := d.tryGet(ctx, strv(m, "@odata.id")); b != nil {
					return b
				}
			}
		}
	}
	return d.firstMember(ctx, link(root, "Chassis"))
}

func (d *Driver) temperatures(ctx context.Context, chassis map[string]any) []bmc.Temperature {
	if ts := tempsFrom(d.tryGet(ctx, link(chassis, "Thermal"))); len(ts) > 0 {
		return ts
	}
	// Redfish 2020.4+: ThermalSubsystem/ThermalMetrics.TemperatureReadingsCelsius.
	tm := d.tryGet(ctx, link(d.tryGet(ctx, link(chassis, "ThermalSubsystem")), "ThermalMetrics"))
	return thermalMetricsFrom(tm)
}

// thermalMetricsFrom reads ThermalMetrics.TemperatureReadingsCelsius[]
// (DeviceName, Reading); non-numeric readings are skipped.
func thermalMetricsFrom(tm map[string]any) []bmc.Temperature {
	rs, _ := tm["TemperatureReadingsCelsius"].([]any)
	var out []bmc.Temperature
	for _, r := range rs {
		m, _ := r.(map[string]any)
		c, ok := num(m, "Reading")
		if !ok {
			continue
		}
		out = append(out, bmc.Temperature{Name: strv(m, "DeviceName"), Celsius: c})
	}
	return out
}

// tempsFrom reads Thermal.Temperatures[].ReadingCelsius; readings that are
// not numbers (null, missing, "N/A") are skipped, and so are sensors whose
// Status.State is "Absent" (Redfish Resource.State: the sensor is not
// populated; HPE iLO 5 reports those with ReadingCelsius 0).
func tempsFrom(th map[string]any) []bmc.Temperature {
	ts, _ := th["Temperatures"].([]any)
	var out []bmc.Temperature
	for _, t := range ts {
		m, _ := t.(map[string]any)
		if strv(obj(m, "Status"), "State") == "Absent" {
			continue
		}
		c, ok := num(m, "ReadingCelsius")
		if !ok {
			continue // "N/A", null, absent: unknown
		}
		out = append(out, bmc.Temperature{Name: strv(m, "Name"), Celsius: c, Health: strv(obj(m, "Status"), "Health")})
	}
	return out
}

func (d *Driver) powerDraw(ctx context.Context, chassis map[string]any) *float64 {
	if w := powerControlWatts(d.tryGet(ctx, link(chassis, "Power"))); w != nil {
		return w
	}
	return envWatts(d.tryGet(ctx, link(chassis, "EnvironmentMetrics")))
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
// first, then the Managers'.
func (d *Driver) logs(ctx context.Context, sys, root map[string]any) []bmc.LogEntry {
	services := []string{link(sys, "LogServices")}
	for _, m := range members(d.tryGet(ctx, link(root, "Managers"))) {
		services = append(services, link(d.tryGet(ctx, m), "LogServices"))
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
func (d *Driver) Health(ctx context.Context) (bmc.PowerState, string, error) {
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
