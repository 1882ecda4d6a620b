package ipmi

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/bougou/go-ipmi/pkg/client"
	"github.com/bougou/go-ipmi/pkg/types"

	"github.com/machina-metal/machina/bmc"
)

// Info returns what IPMI reports:
//
//   - BMCFirmware and Firmware["BMC"] from Get Device ID (App 01h): major.minor
//     firmware revision;
//   - Manufacturer, Model, Serial from FRU device 0 (product area, else board
//     area; IPMI Platform Management FRU Information Storage Definition v1.0);
//   - UUID from Get System GUID (App 37h) when answered;
//   - Power from Get Chassis Status;
//   - Temperatures (sensor type 01h) and PowerWatts (the first sensor whose
//     unit is watts) from the SDR repository and Get Sensor Reading;
//     Health is the worst threshold status of all readable sensors;
//   - Logs from the SEL.
//
// "biosVersion" and "nics" are always listed in Missing (IPMI has neither);
// any other section the BMC does not answer is listed there too. Only a
// failure to reach the BMC at all (power state) is an error.
func (d *Driver) Info(ctx context.Context) (_ *bmc.Info, err error) {
	defer func() { err = bmc.WithBMC(d.cfg.Address, err) }()
	d.mu.Lock()
	defer d.mu.Unlock()
	info := &bmc.Info{}
	missing := []string{}
	miss := func(section string, err error) {
		d.log.Debug("ipmi info section missing", "section", section, "err", err)
		missing = append(missing, section)
	}

	p, err := d.powerState(ctx)
	if err != nil {
		return nil, err
	}
	info.Power = p

	d.infoFirmware(ctx, info, miss)
	d.infoIdentity(ctx, info, miss)
	d.infoUUID(ctx, info, miss)
	d.infoSensors(ctx, info, miss)
	d.infoLogs(ctx, info, miss)
	missing = append(missing, "biosVersion", "nics")
	info.Missing = dedupe(missing)
	return info, nil
}

// infoFirmware reads the firmware: the BMC's firmware revision (Get Device ID).
func (d *Driver) infoFirmware(ctx context.Context, info *bmc.Info, miss func(string, error)) {
	data, err := d.raw(ctx, "get device id", types.NetFnAppRequest, 0x01, nil)
	if err == nil {
		info.BMCFirmware, err = deviceIDFirmware(data)
	}
	if err != nil {
		miss("firmware", err)
		return
	}
	info.Firmware = []bmc.FirmwareEntry{{Name: "BMC", Version: info.BMCFirmware}}
}

// deviceIDFirmware decodes the firmware revision from a Get Device ID
// response's data (App 01h, IPMI v2.0 section 20.1 table 20-2, after the
// completion code): byte 3 is the major revision (bits 6:0, binary), byte 4
// the minor revision (BCD), printed "major.minor" with the minor as its two
// BCD digits, as ipmitool's "mc info" prints it. Bytes 1-11 are mandatory;
// the Auxiliary Firmware Revision (bytes 12-15) is optional and ignored,
// so a BMC answering 11 to 14 data bytes keeps its revision (go-ipmi's
// decoder rejects 12-14). Fewer than 11 bytes is an error.
func deviceIDFirmware(data []byte) (string, error) {
	if len(data) < 11 {
		return "", fmt.Errorf("ipmi: get device id: answer has %d data bytes, want at least 11", len(data))
	}
	return fmt.Sprintf("%d.%02x", data[2]&0x7f, data[3]), nil
}

// infoIdentity reads the identity: manufacturer, model and serial from FRU 0's product area, else its board area.
func (d *Driver) infoIdentity(ctx context.Context, info *bmc.Info, miss func(string, error)) {
	var fru *types.FRU
	err := d.call(ctx, "get fru 0", func(c *client.Client) error {
		f, err := c.GetFRU(ctx, 0, "")
		fru = f
		return err
	})
	switch {
	case err != nil:
		miss("identity", err)
	case fru == nil || !fru.Present():
		miss("identity", errors.New("fru 0 not present"))
	default:
		if pa := fru.ProductInfoArea; pa != nil {
			info.Manufacturer = clean(pa.Manufacturer)
			info.Model = clean(pa.Name)
			info.Serial = clean(pa.SerialNumber)
		}
		if ba := fru.BoardInfoArea; ba != nil {
			if info.Manufacturer == "" {
				info.Manufacturer = clean(ba.Manufacturer)
			}
			if info.Model == "" {
				info.Model = clean(ba.ProductName)
			}
			if info.Serial == "" {
				info.Serial = clean(ba.SerialNumber)
			}
		}
		if info.Manufacturer == "" && info.Model == "" && info.Serial == "" {
			miss("identity", errors.New("fru 0 has no board or product area"))
		}
	}
}

// infoUUID reads the uuid: the system GUID, SMBIOS byte order.
func (d *Driver) infoUUID(ctx context.Context, info *bmc.Info, miss func(string, error)) {
	err := d.call(ctx, "get system guid", func(c *client.Client) error {
		r, err := c.GetSystemGUID(ctx)
		if err != nil {
			return err
		}
		u, err := types.ParseGUID(r.GUID[:], types.GUIDModeSMBIOS)
		if err != nil {
			return err
		}
		info.UUID = u.String()
		return nil
	})
	if err != nil {
		miss("uuid", err)
	}
}

// infoSensors reads the temperatures, power and health from the sensors: health is the worst threshold status of the readable ones.
func (d *Driver) infoSensors(ctx context.Context, info *bmc.Info, miss func(string, error)) {
	var sensors []*types.Sensor
	err := d.call(ctx, "get sensors", func(c *client.Client) error {
		s, err := c.GetSensors(ctx)
		sensors = s
		return err
	})
	if err != nil {
		miss("temperatures", err)
		miss("power", err)
		miss("health", err)
	} else {
		health := ""
		for _, s := range sensors {
			if s.NotPresent || !s.ReadingAvailable || s.ScanningDisabled {
				continue
			}
			h := sensorHealth(s)
			health = worse(health, h)
			if s.SensorType == types.SensorTypeTemperature && s.HasAnalogReading {
				info.Temperatures = append(info.Temperatures, bmc.Temperature{Name: s.Name, Celsius: s.Value, Health: h})
			}
			if s.SensorUnit.BaseUnit == types.SensorUnitType_Watts && info.PowerWatts == nil && s.HasAnalogReading {
				w := s.Value
				info.PowerWatts = &w
			}
		}
		info.Health = health
		if len(info.Temperatures) == 0 {
			miss("temperatures", errors.New("no temperature sensor"))
		}
		if info.PowerWatts == nil {
			miss("power", errors.New("no watts sensor"))
		}
		if health == "" {
			miss("health", errors.New("no readable sensor"))
		}
	}
}

// infoLogs reads the logs: the SEL's standard entries.
func (d *Driver) infoLogs(ctx context.Context, info *bmc.Info, miss func(string, error)) {
	var sels []*types.SEL
	err := d.call(ctx, "get sel entries", func(c *client.Client) error {
		s, err := c.GetSELEntries(ctx, 0)
		sels = s
		return err
	})
	if err != nil {
		miss("logs", err)
	} else {
		for _, e := range sels {
			if e == nil || e.Standard == nil {
				continue
			}
			info.Logs = append(info.Logs, bmc.LogEntry{
				Created:  e.Standard.Timestamp,
				Severity: string(e.Standard.EventSeverity()),
				Message:  fmt.Sprintf("%s #%d: %s", e.Standard.SensorType, e.Standard.SensorNumber, e.Standard.EventString()),
			})
		}
	}
}

// sensorHealth maps a threshold sensor's status (IPMI v2.0 §35.14, Get
// Sensor Reading byte 3) to the rollup vocabulary; "" for other sensors.
func sensorHealth(s *types.Sensor) string {
	if !s.IsThreshold() {
		return ""
	}
	switch s.Threshold.ThresholdStatus {
	case types.SensorThresholdStatus_OK:
		return "OK"
	case types.SensorThresholdStatus_LNC, types.SensorThresholdStatus_UNC:
		return "Warning"
	case types.SensorThresholdStatus_LCR, types.SensorThresholdStatus_UCR,
		types.SensorThresholdStatus_LNR, types.SensorThresholdStatus_UNR:
		return "Critical"
	}
	return ""
}

func worse(a, b string) string {
	rank := map[string]int{"": 0, "OK": 1, "Warning": 2, "Critical": 3}
	if rank[b] > rank[a] {
		return b
	}
	return a
}

func clean(b []byte) string {
	return strings.TrimSpace(strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return -1
		}
		return r
	}, string(b)))
}

func dedupe(s []string) []string {
	seen := map[string]bool{}
	out := s[:0]
	for _, x := range s {
		if !seen[x] {
			seen[x] = true
			out = append(out, x)
		}
	}
	return out
}
