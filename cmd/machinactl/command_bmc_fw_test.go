package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestBMCFirmwareVerbs: bios get|set, secureboot, firmware list|update and
// raid list|create|delete against bmcsim over the iDRAC and XCC trees.
func TestBMCFirmwareVerbs(t *testing.T) {
	_, _, url := startSim(t, "dell-poweredge-r750-idrac9", true)
	t.Setenv("MACHINA_BMC_PASSWORD", "pa ss:word")
	base := []string{"bmc", "--address", url, "--username", "ops"}
	run := func(args ...string) (int, string, string) {
		t.Helper()
		return runCtl(t, "", append(append([]string{}, base...), args...)...)
	}
	code, out, errs := run("bios", "get", "ProcVirtualization", "AcPwrRcvryUserDelay")
	if code != 0 || out != "AcPwrRcvryUserDelay=120\nProcVirtualization=Enabled\n" {
		t.Fatalf("bios get: %d %q %q", code, out, errs)
	}
	code, out, errs = run("bios", "set", "ProcVirtualization=Disabled", "AcPwrRcvryUserDelay=150")
	if code != 0 || !regexp.MustCompile(`^bios settings written: apply OnReset, reset required \(job /redfish/v1/Managers/iDRAC.Embedded.1/Jobs/JID_\d+\)\n$`).MatchString(out) {
		t.Fatalf("bios set: %d %q %q", code, out, errs)
	}
	code, out, _ = run("bios", "get", "ProcVirtualization", "AcPwrRcvryUserDelay")
	if code != 0 || out != "AcPwrRcvryUserDelay=120 (pending: 150)\nProcVirtualization=Enabled (pending: Disabled)\n" {
		t.Fatalf("bios get pending: %d %q", code, out)
	}
	code, _, errs = run("bios", "set", "ProcVirtualization=Sideways")
	if code == 0 || !strings.Contains(errs, "bios attribute ProcVirtualization") || !strings.Contains(errs, "allowed: Enabled, Disabled") {
		t.Fatalf("bios set refused: %d %q", code, errs)
	}
	code, _, errs = run("bios", "set", "SystemBiosVersion=9")
	if code == 0 || !strings.Contains(errs, "SystemBiosVersion: read-only") {
		t.Fatalf("bios set read-only: %d %q", code, errs)
	}
	code, out, _ = run("secureboot")
	if code != 0 || out != "secureboot off (current boot Disabled, mode DeployedMode)\n" {
		t.Fatalf("secureboot: %d %q", code, out)
	}
	code, out, _ = run("secureboot", "on")
	if code != 0 || out != "secureboot on: apply OnReset, reset required\n" {
		t.Fatalf("secureboot on: %d %q", code, out)
	}
	code, out, _ = run("firmware", "list")
	if code != 0 || !strings.Contains(out, "Current-159-1.8.2__BIOS.Setup.1-1") {
		t.Fatalf("firmware list: %d %q", code, out)
	}
	code, out, errs = run("firmware", "update", "--poll", "1ms", "http://10.0.0.1/fw/BIOS_1.9.0.exe")
	if code != 0 || !strings.HasPrefix(out, "update done: task /redfish/v1/TaskService/Tasks/fw") || !strings.Contains(errs, "100%") {
		t.Fatalf("firmware update: %d %q %q", code, out, errs)
	}
	code, out, _ = run("firmware", "list")
	if code != 0 || !strings.Contains(out, "1.9.0") {
		t.Fatalf("firmware list after update: %d %q", code, out)
	}
	img := filepath.Join(t.TempDir(), "BIOS_2.0.0.exe")
	if err := os.WriteFile(img, []byte("image"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errs = run("firmware", "update", "--poll", "1ms", "--file", img)
	if code != 0 || !strings.HasPrefix(out, "update done:") {
		t.Fatalf("firmware update --file: %d %q %q", code, out, errs)
	}

	_, _, lurl := startSim(t, "lenovo-thinksystem-sr670v2-xcc", true)
	lbase := []string{"bmc", "--address", lurl, "--username", "ops"}
	code, out, _ = runCtl(t, "", append(append([]string{}, lbase...), "raid", "list")...)
	if code != 0 || !strings.Contains(out, "controller M.2") || !strings.Contains(out, "raid RAID1") || !strings.Contains(out, "drive Drive.M.2_Bay_0") {
		t.Fatalf("raid list: %d %q", code, out)
	}
	code, out, errs = runCtl(t, "", append(append([]string{}, lbase...), "raid", "create", "--controller", "M.2", "--raid", "RAID1", "--drive", "Drive.M.2_Bay_0", "--drive", "Drive.M.2_Bay_1", "--name", "os")...)
	if code != 0 || out != "volume create accepted: apply Immediate, in effect\n" {
		t.Fatalf("raid create: %d %q %q", code, out, errs)
	}
	code, out, _ = runCtl(t, "", append(append([]string{}, lbase...), "raid", "list")...)
	m := regexp.MustCompile(`volume (\S+)\s+os RAID1`).FindStringSubmatch(out)
	if code != 0 || m == nil {
		t.Fatalf("raid list after create: %q", out)
	}
	code, out, errs = runCtl(t, "", append(append([]string{}, lbase...), "raid", "delete", "M.2", m[1])...)
	if code != 0 || out != "volume delete accepted: apply Immediate, in effect\n" {
		t.Fatalf("raid delete: %d %q %q", code, out, errs)
	}
}

// TestBMCFirmwareVerbsIPMIUnsupported: the IPMI driver has none of the
// firmware capabilities; each verb says so before talking to the BMC.
func TestBMCFirmwareVerbsIPMIUnsupported(t *testing.T) {
	t.Setenv("MACHINA_BMC_PASSWORD", "password")
	for _, args := range [][]string{{"bios", "get"}, {"raid", "list"}, {"firmware", "list"}, {"secureboot"}} {
		code, _, errs := runCtl(t, "", append([]string{"bmc", "--driver", "ipmi", "--address", "127.0.0.1:9", "--username", "admin", "--timeout", "5s"}, args...)...)
		if code == 0 || !strings.Contains(errs, "not supported by this BMC") {
			t.Fatalf("%v: %d %q", args, code, errs)
		}
	}
}
