package ipmi

import (
	"bytes"
	"errors"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/machina-metal/machina/bmc"
)

// TestInfoAgainstIPMISim reads the read model from ipmi_sim (fixture
// sim.emu: FRU, three sensors, two SEL records) and cross-checks identity
// and firmware with ipmitool.
func TestInfoAgainstIPMISim(t *testing.T) {
	s := startSim(t)
	ctx := testCtx(t)
	d := newDriver(t, s.addr(), "admin", "password", nil)
	info, err := d.Info(ctx)
	if err != nil {
		t.Fatalf("Info: %v", err)
	}
	t.Logf("info: %+v", *info)
	fru := s.ipmitool("fru", "print", "0")
	field := func(name string) string {
		m := regexp.MustCompile(`(?m)^\s*` + regexp.QuoteMeta(name) + `\s*:\s*(.*?)\s*$`).FindStringSubmatch(fru)
		if m == nil {
			t.Fatalf("ipmitool fru print 0 has no %q:\n%s", name, fru)
		}
		return m[1]
	}
	if want := field("Product Manufacturer"); info.Manufacturer != want {
		t.Errorf("Manufacturer = %q, ipmitool says %q", info.Manufacturer, want)
	}
	if want := field("Product Name"); info.Model != want {
		t.Errorf("Model = %q, ipmitool says %q", info.Model, want)
	}
	if want := field("Product Serial"); info.Serial != want {
		t.Errorf("Serial = %q, ipmitool says %q", info.Serial, want)
	}
	mc := s.ipmitool("mc", "info")
	if m := regexp.MustCompile(`Firmware Revision\s*:\s*(\S+)`).FindStringSubmatch(mc); m == nil || info.BMCFirmware != m[1] {
		t.Errorf("BMCFirmware = %q, ipmitool mc info: %v", info.BMCFirmware, m)
	}
	temps := map[string]float64{}
	for _, tt := range info.Temperatures {
		temps[tt.Name] = tt.Celsius
	}
	// sim.emu: sensor_set_value Inlet Temp 25, CPU1 Temp 45 (M=1, B=0).
	if temps["Inlet Temp"] != 25 || temps["CPU1 Temp"] != 45 || len(temps) != 2 {
		t.Errorf("Temperatures = %+v, want Inlet Temp 25, CPU1 Temp 45", info.Temperatures)
	}
	if info.Health != "OK" || info.Power != bmc.PowerOff {
		t.Errorf("Health, Power = %q, %q; want OK, off", info.Health, info.Power)
	}
	if len(info.Logs) != 2 {
		t.Errorf("Logs = %+v, want the 2 SEL records of sim.emu", info.Logs)
	}
	for _, m := range []string{"nics", "biosVersion", "power"} {
		if !slices.Contains(info.Missing, m) {
			t.Errorf("Missing = %q, want it to list %q", info.Missing, m)
		}
	}
	for _, m := range []string{"identity", "temperatures", "firmware", "logs", "health"} {
		if slices.Contains(info.Missing, m) {
			t.Errorf("Missing = %q lists %q, which ipmi_sim reports", info.Missing, m)
		}
	}
}

// TestSOLPasswordNeverInArgv opens IPMI SOL on ipmi_sim through ipmitool
// and proves from /proc/PID/cmdline that the password is not on the command
// line but in the child's environment; Close releases the SOL payload so a
// second session can activate.
func TestSOLPasswordNeverInArgv(t *testing.T) {
	s := startSim(t)
	ctx := testCtx(t)
	const secret = "S3cret-SOL-pw"
	// lan.conf has user 5 "solop" with this distinctive password.
	d := newDriver(t, s.addr(), "solop", secret, nil)
	rwc, err := d.OpenConsole(ctx)
	if err != nil {
		t.Fatalf("OpenConsole: %v", err)
	}
	con := rwc.(*SOLConsole)
	pid := con.PID()
	cmdline, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		t.Fatal(err)
	}
	args := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
	t.Logf("ipmitool argv: %q", args)
	if bytes.Contains(cmdline, []byte(secret)) {
		t.Fatalf("password found in /proc/%d/cmdline: %q", pid, args)
	}
	if !slices.Contains(args, "-E") || slices.Contains(args, "-P") {
		t.Errorf("argv %q: want -E and no -P", args)
	}
	environ, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(strings.Split(string(environ), "\x00"), "IPMI_PASSWORD="+secret) {
		t.Errorf("IPMI_PASSWORD not in the child's environment")
	}
	if _, err := con.Write([]byte("hello\r")); err != nil {
		t.Errorf("Write: %v", err)
	}
	// While active, a second activation is refused by the BMC.
	if second, err := d.OpenConsole(ctx); err == nil {
		second.Close()
		t.Errorf("second OpenConsole while the first is active succeeded, want ErrRefused")
	} else if !errors.Is(err, bmc.ErrRefused) {
		t.Errorf("second OpenConsole = %v, want ErrRefused", err)
	}
	start := time.Now()
	if err := con.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); err == nil {
		t.Errorf("ipmitool PID %d still exists after Close", pid)
	}
	t.Logf("close took %v", time.Since(start))
	again, err := d.OpenConsole(ctx)
	if err != nil {
		t.Fatalf("OpenConsole after Close = %v, want the payload released", err)
	}
	if err := again.Close(); err != nil {
		t.Fatal(err)
	}
	if err := again.Close(); err != nil {
		t.Errorf("second Close = %v", err)
	}
}
