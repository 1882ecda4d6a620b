package main

import (
	"context"
	"encoding/pem"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/machina-metal/machina/bmc/bmcsim"
)

// offPower is a host that never powers on: the BMC accepts every reset and
// keeps reporting Off.
type offPower struct{}

func (offPower) PowerState(context.Context) (string, error) { return "Off", nil }
func (offPower) Reset(context.Context, string) error        { return nil }

// simServer serves tree with quirks q and power backend p over plain HTTP,
// or TLS when tls is set (then it also returns a PEM file of the server's
// certificate for --ca-file).
func simServer(t *testing.T, tree string, q *bmcsim.Quirks, p bmcsim.PowerBackend, tls bool) (url, caFile string) {
	t.Helper()
	dir, err := bmcsim.TreeDir("", tree)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := bmcsim.LoadTree(dir)
	if err != nil {
		t.Fatal(err)
	}
	sim, err := bmcsim.New(bmcsim.Config{Tree: tr, Username: "ops", Password: "pa ss:word", Power: p, Quirks: q})
	if err != nil {
		t.Fatal(err)
	}
	if !tls {
		ts := httptest.NewServer(sim)
		t.Cleanup(ts.Close)
		return ts.URL, ""
	}
	ts := httptest.NewTLSServer(sim)
	t.Cleanup(ts.Close)
	caFile = filepath.Join(t.TempDir(), "bmc ca.pem") // a space: the hint must quote it
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ts.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	return ts.URL, caFile
}

// TestBMCUndoHintHasEveryFlag: the "to undo" command printed when a BMC
// turned a one-time override persistent carries every flag needed to run
// it against the same BMC the same way (--ca-file, quoted; --auth;
// --password-stdin) and the boot mode, so pasting it works. Before it
// dropped --ca-file, --auth, --password-stdin and --mode.
func TestBMCUndoHintHasEveryFlag(t *testing.T) {
	t.Setenv("MACHINA_BMC_PASSWORD", "")
	url, ca := simServer(t, "dell-poweredge-r750-idrac9", &bmcsim.Quirks{StoreContinuousForOnce: true}, bmcsim.NewMemoryPower(true), true)
	code, _, errs := runCtl(t, "pa ss:word\n", "bmc", "--address", url, "--username", "ops", "--password-stdin", "--ca-file", ca, "--auth", "basic", "boot", "pxe", "--mode", "uefi")
	want := "to undo: machinactl bmc --driver redfish --address " + url + " --username ops --password-stdin --ca-file '" + ca + "' --auth basic boot disk --persistent --mode uefi"
	if code != 1 || !strings.Contains(errs, want) {
		t.Errorf("exit %d, stderr %q; want exit 1 and %q", code, errs, want)
	}
	if strings.Contains(errs, "pa ss:word") {
		t.Errorf("stderr carries the password: %q", errs)
	}
}

// TestBMCPowerWait: a power verb waits --wait (default 3m, not the 10m
// --timeout it used to wait) for the BMC to report the state, and its
// error names the flag.
func TestBMCPowerWait(t *testing.T) {
	if got := newBMCCmd(&env{}).PersistentFlags().Lookup("wait"); got == nil || got.DefValue != "3m0s" {
		t.Fatalf("--wait flag = %+v, want default 3m0s", got)
	}
	// The BMC never reports the host on, nor a host start: the Redfish
	// driver counts a moved LastResetTime as the power-on having taken.
	q := bmcsim.DefaultQuirks("Dell")
	q.NoLastResetTime = true
	url, _ := simServer(t, "dell-poweredge-r750-idrac9", &q, offPower{}, false)
	t.Setenv("MACHINA_BMC_PASSWORD", "pa ss:word")
	code, out, errs := runCtl(t, "", "bmc", "--address", url, "--username", "ops", "--wait", "300ms", "power", "on")
	if code == 0 || !strings.Contains(errs, "--wait 300ms") || !strings.Contains(errs, "still off") {
		t.Errorf("exit %d, stdout %q, stderr %q; want a failure naming --wait 300ms and the state", code, out, errs)
	}
}

// TestBMCAuthAndSchemeMessages: --auth session against a BMC without a
// session service says so and suggests --auth basic (it blamed the
// credentials before); an https address to the BMC's plain-HTTP port names
// the http URL to use (it said unreachable after retries before).
func TestBMCAuthAndSchemeMessages(t *testing.T) {
	t.Setenv("MACHINA_BMC_PASSWORD", "pa ss:word")
	url, _ := simServer(t, "openbmc-bmcweb-stock", &bmcsim.Quirks{BasicOnly: true}, bmcsim.NewMemoryPower(true), false)
	code, _, errs := runCtl(t, "", "bmc", "--address", url, "--username", "ops", "--auth", "session", "power", "status")
	if code == 0 || !strings.Contains(errs, "no Redfish session service") || !strings.Contains(errs, "--auth basic") || strings.Contains(errs, "credentials refused") {
		t.Errorf("--auth session, no session service: exit %d, stderr %q", code, errs)
	}
	https := "https://" + strings.TrimPrefix(url, "http://")
	code, _, errs = runCtl(t, "", "bmc", "--address", https, "--username", "ops", "power", "status")
	if code == 0 || !strings.Contains(errs, "use "+url) || strings.Contains(errs, "unreachable") {
		t.Errorf("https to an HTTP port: exit %d, stderr %q; want 'use %s'", code, errs, url)
	}
}
