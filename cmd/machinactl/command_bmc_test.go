package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/machina-metal/machina/bmc"
	"github.com/machina-metal/machina/bmc/bmcsim"
	"github.com/machina-metal/machina/bmc/ipmi/ipmisim/ipmisimtest"
	"github.com/machina-metal/machina/internal/pyghmibmc"
)

func startSim(t *testing.T, tree string, on bool) (*bmcsim.Server, *bmcsim.MemoryPower, string) {
	t.Helper()
	return startSimQuirks(t, tree, on, nil)
}

// startSimQuirks is startSim with bmcsim quirks q (nil: the tree's defaults).
func startSimQuirks(t *testing.T, tree string, on bool, q *bmcsim.Quirks) (*bmcsim.Server, *bmcsim.MemoryPower, string) {
	t.Helper()
	dir, err := bmcsim.TreeDir("", tree)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := bmcsim.LoadTree(dir)
	if err != nil {
		t.Fatal(err)
	}
	pw := bmcsim.NewMemoryPower(on)
	sim, err := bmcsim.New(bmcsim.Config{Tree: tr, Username: "ops", Password: "pa ss:word", Power: pw, Quirks: q, LockoutThreshold: 3})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(sim)
	t.Cleanup(ts.Close)
	return sim, pw, ts.URL
}

func runCtl(t *testing.T, stdin string, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(context.Background(), args, strings.NewReader(stdin), &out, &errb)
	return code, out.String(), errb.String()
}

func TestBMCPowerBootMediaInfo(t *testing.T) {
	sim, pw, url := startSim(t, "dell-poweredge-r750-idrac9", false)
	t.Setenv("MACHINA_BMC_PASSWORD", "pa ss:word")
	base := []string{"bmc", "--address", url, "--username", "ops"}
	steps := []struct {
		args []string
		want string
	}{
		{[]string{"power", "status"}, "off\n"},
		{[]string{"power", "on"}, "power on: done, now on\n"},
		{[]string{"power", "on"}, "power on: done, now on\n"},
		{[]string{"boot", "pxe", "--persistent", "--mode", "uefi"}, "boot override set: pxe persistent uefi\n"},
		{[]string{"boot", "status"}, "pxe persistent uefi\n"},
		{[]string{"media", "insert", "http://10.0.0.1/x.iso", "--boot"}, "media inserted\nboot override set: cd once\n"},
		{[]string{"media", "eject"}, "media ejected\n"},
		{[]string{"power", "cycle"}, "power cycle: done (verified: LastResetTime changed), now on\n"},
	}
	for _, s := range steps {
		code, out, errs := runCtl(t, "", append(base, s.args...)...)
		if code != 0 || out != s.want {
			t.Fatalf("%v: exit %d, stdout %q, stderr %q; want 0, %q", s.args, code, out, errs, s.want)
		}
	}
	if !pw.On() || pw.Resets["On"] != 1 || pw.Resets["PowerCycle"] != 1 {
		t.Errorf("backend resets = %v, want one On and one PowerCycle", pw.Resets)
	}
	if n := sim.Sessions(); n != 0 {
		t.Errorf("sessions left on the BMC: %d", n)
	}
	code, out, _ := runCtl(t, "", append(base, "info", "--json")...)
	var in bmc.Info
	if code != 0 || json.Unmarshal([]byte(out), &in) != nil || in.Serial != "CNIVC0014M0388" || in.Power != bmc.PowerOn {
		t.Fatalf("info --json: exit %d, %+v", code, in)
	}
	code, out, _ = runCtl(t, "", append(base, "info")...)
	if code != 0 || !strings.Contains(out, "serial") || !strings.Contains(out, "CNIVC0014M0388") {
		t.Fatalf("info table: exit %d\n%s", code, out)
	}
}

func TestBMCPasswordStdin(t *testing.T) {
	_, _, url := startSim(t, "openbmc-bmcweb-stock", true)
	t.Setenv("MACHINA_BMC_PASSWORD", "")
	code, out, errs := runCtl(t, "pa ss:word\n", "bmc", "--address", url, "--username", "ops", "--password-stdin", "power", "status")
	if code != 0 || out != "on\n" {
		t.Fatalf("exit %d, %q, %q", code, out, errs)
	}
	code, _, errs = runCtl(t, "", "bmc", "--address", url, "--username", "ops", "power", "status")
	if code != 2 || !strings.Contains(errs, "no password") {
		t.Errorf("no password: exit %d, %q", code, errs)
	}
	code, _, errs = runCtl(t, "", "bmc", "--address", url, "--username", "ops", "--password", "x", "power", "status")
	if code == 0 || !strings.Contains(errs, "unknown flag: --password") {
		t.Errorf("--password flag accepted: exit %d, %q", code, errs)
	}
	code, _, errs = runCtl(t, "wrong\n", "bmc", "--address", url, "--username", "ops", "--password-stdin", "power", "status")
	if code == 0 || !strings.Contains(errs, "HTTP 401") || strings.Contains(errs, "wrong") {
		t.Errorf("wrong password: exit %d, %q", code, errs)
	}
}

func TestBMCDriverFactory(t *testing.T) {
	if _, err := newDriver("ipmi", "https://u:secret@10.0.0.1", "u", "p", false, driverOpts{}); err == nil || strings.Contains(err.Error(), "secret") {
		t.Errorf("ipmi with a URL: err = %v, want a refusal that does not repeat the address", err)
	}
	if _, err := newDriver("snmp", "10.0.0.1", "u", "p", false, driverOpts{}); err == nil {
		t.Error("unknown driver accepted")
	}
	for _, tc := range []struct{ in, endpoint, system string }{
		{"10.0.0.5", "https://10.0.0.5", ""},
		{"https://10.0.0.5:8443/", "https://10.0.0.5:8443", ""},
		{"https://bmc/redfish/v1/Systems/System.Embedded.1", "https://bmc", "System.Embedded.1"},
	} {
		ep, sys, err := splitRedfishAddress(tc.in)
		if err != nil || ep != tc.endpoint || sys != tc.system {
			t.Errorf("splitRedfishAddress(%q) = %q, %q, %v; want %q, %q", tc.in, ep, sys, err, tc.endpoint, tc.system)
		}
	}
	for _, bad := range []string{"", "https://u:p@bmc", "https://bmc/other", "ftp://bmc", "https://bmc/?x=1"} {
		_, _, err := splitRedfishAddress(bad)
		if err == nil {
			t.Errorf("splitRedfishAddress(%q) accepted", bad)
		} else if strings.Contains(bad, "u:p@") && strings.Contains(err.Error(), "u:p") {
			t.Errorf("splitRedfishAddress(%q) error repeats the credentials: %v", bad, err)
		}
	}
}

// TestBMCIPMIAgainstIpmiSim: machinactl bmc --driver ipmi against OpenIPMI's
// ipmi_sim on loopback, cross-checked with ipmitool.
func TestBMCIPMIAgainstIpmiSim(t *testing.T) {
	sim := ipmisimtest.Start(t)
	t.Setenv("MACHINA_BMC_PASSWORD", "password")
	base := []string{"bmc", "--driver", "ipmi", "--address", sim.Addr(), "--username", "admin"}
	for _, args := range [][]string{{"power", "on"}, {"boot", "pxe", "--mode", "uefi"}} {
		if out, errOut, code := runCLI(t, append(append([]string{}, base...), args...)...); code != 0 {
			t.Fatalf("machinactl bmc %v: exit %d\n%s%s", args, code, out, errOut)
		}
	}
	out, errOut, code := runCLI(t, append(append([]string{}, base...), "power", "status")...)
	if code != 0 || !strings.Contains(out, "on") {
		t.Fatalf("power status: exit %d, output %q %s", code, out, errOut)
	}
	if got := sim.Ipmitool("chassis", "power", "status"); !strings.Contains(got, "Chassis Power is on") {
		t.Errorf("ipmitool says %q after machinactl bmc power on", got)
	}
	if got := sim.Ipmitool("chassis", "bootparam", "get", "5"); !strings.Contains(got, "PXE") {
		t.Errorf("ipmitool bootparam 5 = %q, want PXE", got)
	}
}

// TestBMCRealBMCModes: a Basic-only BMC works with the right
// password and refuses the wrong one in one attempt, saying so and which
// scheme; a one-time boot the BMC turns persistent exits 1 naming what it
// is set to and the undo command; an unverified reset says so; the
// driver's warnings reach stderr.
func TestBMCRealBMCModes(t *testing.T) {
	t.Setenv("MACHINA_BMC_PASSWORD", "")
	sim, _, url := startSimQuirks(t, "openbmc-bmcweb-stock", true, &bmcsim.Quirks{BasicOnly: true})
	code, out, errs := runCtl(t, "pa ss:word\n", "bmc", "--address", url, "--username", "ops", "--password-stdin", "power", "status")
	if code != 0 || out != "on\n" {
		t.Fatalf("Basic-only, right password: exit %d, %q, %q", code, out, errs)
	}
	sim.ClearRequests()
	code, _, errs = runCtl(t, "wrong\n", "bmc", "--address", url, "--username", "ops", "--password-stdin", "info")
	if code == 0 || !strings.Contains(errs, "credentials refused") || !strings.Contains(errs, "HTTP Basic") || strings.Count(errs, "credentials refused") != 1 {
		t.Errorf("Basic-only, wrong password: exit %d, stderr %q; want one 'credentials refused (HTTP Basic)'", code, errs)
	}
	refused := 0
	for _, r := range sim.Requests() {
		if r.Status == 401 {
			refused++
		}
	}
	if refused != 1 || sim.Locked() {
		t.Errorf("wrong password: %d refused attempts (locked %v), want exactly 1", refused, sim.Locked())
	}

	_, _, url = startSimQuirks(t, "dell-poweredge-r750-idrac9", true, &bmcsim.Quirks{StoreContinuousForOnce: true})
	t.Setenv("MACHINA_BMC_PASSWORD", "pa ss:word")
	base := []string{"bmc", "--address", url, "--username", "ops"}
	code, out, errs = runCtl(t, "", append(base, "boot", "pxe")...)
	if code != 1 || !strings.Contains(errs, "now set to pxe persistent") || !strings.Contains(errs, "boot disk --persistent") || strings.Contains(out, "boot override set") {
		t.Errorf("Once coerced: exit %d, stdout %q, stderr %q; want exit 1 naming pxe persistent and the undo command", code, out, errs)
	}

	// A PATCH answered 400 whose read-back matched: the driver's warning
	// reaches stderr (it printed only "boot override set" before).
	_, _, url = startSimQuirks(t, "dell-poweredge-r750-idrac9", true, &bmcsim.Quirks{BootPatchAnswers400: true})
	code, out, errs = runCtl(t, "", "bmc", "--address", url, "--username", "ops", "boot", "disk")
	if code != 0 || !strings.Contains(errs, "level=WARN") || !strings.Contains(errs, "HTTP 400") {
		t.Errorf("refused PATCH that applied: exit %d, stdout %q, stderr %q; want the driver's warning", code, out, errs)
	}

	_, _, url = startSimQuirks(t, "dell-poweredge-r750-idrac9", true, &bmcsim.Quirks{NoLastResetTime: true})
	code, out, errs = runCtl(t, "", "bmc", "--address", url, "--username", "ops", "power", "reset")
	if code != 0 || !strings.Contains(out, "NOT verified") || strings.Contains(out, "done") {
		t.Errorf("reset without evidence: exit %d, stdout %q, stderr %q; want 'NOT verified'", code, out, errs)
	}

	_, _, url = startSimQuirks(t, "openbmc-bmcweb-stock", true, &bmcsim.Quirks{NoAuth: true})
	t.Setenv("MACHINA_BMC_PASSWORD", "")
	code, out, errs = runCtl(t, "", "bmc", "--address", url, "power", "status")
	if code != 0 || out != "on\n" {
		t.Errorf("no authentication, no --username: exit %d, %q, %q", code, out, errs)
	}
}

// A soft-off that had to be forced is said on stderr (it printed only
// "done, now off" before), and so is --insecure.
func TestBMCForcedSoftOffWarns(t *testing.T) {
	_, pw, url := startSim(t, "dell-poweredge-r750-idrac9", true)
	pw.IgnoreGraceful = true
	t.Setenv("MACHINA_BMC_PASSWORD", "pa ss:word")
	code, out, errs := runCtl(t, "", "bmc", "--address", url, "--username", "ops", "--insecure", "--soft-off-timeout", "200ms", "power", "soft-off")
	if code != 0 || !strings.Contains(out, "now off") {
		t.Fatalf("soft-off: exit %d, %q, %q", code, out, errs)
	}
	if !strings.Contains(errs, "forcing off") || !strings.Contains(errs, "--insecure") {
		t.Errorf("stderr %q: want the forced soft-off and the --insecure warning", errs)
	}
}

// TestBMCBootKeptInPart: against pyghmi's Bmc class (VirtualBMC), which
// keeps only the boot device, `bmc boot disk --persistent --mode uefi`
// exits 0 after setting the device, prints what the BMC kept, and warns
// on stderr naming what it did not keep.
func TestBMCBootKeptInPart(t *testing.T) {
	b := pyghmibmc.Start(t, pyghmibmc.Config{})
	t.Setenv("MACHINA_BMC_PASSWORD", "password")
	out, errOut, code := runCLI(t, "bmc", "--driver", "ipmi", "--address", b.Addr(), "--username", "admin", "boot", "disk", "--persistent", "--mode", "uefi")
	if code != 0 {
		t.Fatalf("exit %d, want 0\n%s%s", code, out, errOut)
	}
	if want := "boot override set: disk once bios (asked disk persistent uefi)"; !strings.Contains(out, want) {
		t.Errorf("stdout %q, want %q", out, want)
	}
	for _, want := range []string{"warning:", "does not keep the persistent flag", "ignored the boot mode uefi"} {
		if !strings.Contains(errOut, want) {
			t.Errorf("stderr lacks %q:\n%s", want, errOut)
		}
	}
}
