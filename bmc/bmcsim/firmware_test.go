package bmcsim_test

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/machina-metal/machina/bmc/bmcsim"
)

// TestBiosSettingsPerVendor: the settings object keeps a PATCH until a
// reset; iDRAC applies it only through a job, the others at any reset.
// Registry refusals answer 400 with the Base MessageId and MessageArgs.
func TestBiosSettingsPerVendor(t *testing.T) {
	for _, c := range []struct {
		tree, sys, settings, attr, val string
	}{
		{"dell-poweredge-r750-idrac9", "/redfish/v1/Systems/System.Embedded.1", "/redfish/v1/Systems/System.Embedded.1/Bios/Settings", "ProcVirtualization", "Disabled"},
		{"hpe-proliant-dl385gen10plusv2-ilo5", "/redfish/v1/Systems/1", "/redfish/v1/systems/1/bios/settings/", "AcpiHpet", "Disabled"},
		{"lenovo-thinksystem-sr670v2-xcc", "/redfish/v1/Systems/1", "/redfish/v1/Systems/1/Bios/Pending", "Processors_SWGuardExtensions", "Enabled"},
		{"supermicro-sys821ge-tnhr-x13", "/redfish/v1/Systems/1", "/redfish/v1/Systems/1/Bios/SD", "AES_NI_3C75", "Disable"},
	} {
		t.Run(c.tree, func(t *testing.T) {
			s, cl := start(t, bmcsim.Config{Tree: tree(t, c.tree), Quirks: &bmcsim.Quirks{}})
			if st := cl.login("admin", "pw"); st != 201 {
				t.Fatal(st)
			}
			st, _, m := cl.do("PATCH", c.settings, map[string]any{"Attributes": map[string]any{c.attr: "Sideways"}})
			if st != 400 || !strings.HasSuffix(msgID(m), ".PropertyValueNotInList") {
				t.Fatalf("refusal: %d %v", st, m)
			}
			st, _, m = cl.do("PATCH", c.settings, map[string]any{"Attributes": map[string]any{"NoSuch": 1}})
			if st != 400 || !strings.HasSuffix(msgID(m), ".PropertyUnknown") {
				t.Fatalf("unknown: %d %v", st, m)
			}
			st, _, _ = cl.do("PATCH", c.settings, map[string]any{"Attributes": map[string]any{c.attr: c.val}})
			if st != 200 {
				t.Fatalf("patch: %d", st)
			}
			bios := func() any {
				b := s.Get(c.sys + "/Bios")
				return b["Attributes"].(map[string]any)[c.attr]
			}
			_, _, so := cl.do("GET", c.settings, nil)
			if so["Attributes"].(map[string]any)[c.attr] != c.val || bios() == c.val {
				t.Fatalf("pending: settings %v, bios %v", so["Attributes"].(map[string]any)[c.attr], bios())
			}
			st, _, _ = cl.do("POST", c.sys+"/Actions/ComputerSystem.Reset", map[string]any{"ResetType": "ForceRestart"})
			if st != 204 {
				t.Fatalf("reset %d", st)
			}
			if c.tree == "dell-poweredge-r750-idrac9" {
				if bios() == c.val {
					t.Fatal("dell: applied without a job")
				}
				st, h, _ := cl.do("POST", "/redfish/v1/Managers/iDRAC.Embedded.1/Jobs", map[string]any{"TargetSettingsURI": c.settings})
				if st != 200 || !strings.Contains(h.Get("Location"), "/Jobs/JID_") {
					t.Fatalf("job: %d %v", st, h)
				}
				_, _, j := cl.do("GET", h.Get("Location"), nil)
				if j["JobState"] != "Scheduled" {
					t.Fatalf("job %v", j)
				}
				cl.do("POST", c.sys+"/Actions/ComputerSystem.Reset", map[string]any{"ResetType": "ForceRestart"})
				_, _, j = cl.do("GET", h.Get("Location"), nil)
				if j["JobState"] != "Completed" {
					t.Fatalf("job after reset %v", j)
				}
			}
			if bios() != c.val {
				t.Fatalf("after reset: %v", bios())
			}
		})
	}
}

// TestUpdateRestartsBMC: an update's task grows per poll; when it
// completes the BMC drops the next connection, forgets sessions and
// answers 503 for RestartRequests-1 requests; a negative value keeps it up.
func TestUpdateRestartsBMC(t *testing.T) {
	for _, restart := range []int{0, -1} {
		_, cl := start(t, bmcsim.Config{Tree: tree(t, "hpe-proliant-dl385gen10plusv2-ilo5"), Firmware: bmcsim.Firmware{UpdatePolls: 2, RestartRequests: restart}})
		cl.login("admin", "pw")
		st, h, m := cl.do("POST", "/redfish/v1/UpdateService/Actions/UpdateService.SimpleUpdate", map[string]any{"ImageURI": "http://x/iLO_3.0.bin"})
		if st != 202 || m["TaskState"] != "Running" {
			t.Fatalf("update: %d %v", st, m)
		}
		loc := h.Get("Location")
		var pcs []any
		for i := 0; i < 3; i++ {
			_, _, m = cl.do("GET", loc, nil)
			pcs = append(pcs, m["PercentComplete"])
		}
		if m["TaskState"] != "Completed" || pcs[0].(float64) >= pcs[1].(float64) {
			t.Fatalf("task %v, progress %v", m, pcs)
		}
		req, _ := http.NewRequest("GET", cl.base+"/redfish/v1", nil)
		// A fresh connection: net/http replays a GET dropped on a reused one.
		fresh := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
		resp, err := fresh.Do(req)
		if restart == 0 {
			if err == nil {
				resp.Body.Close()
				t.Fatal("restart: connection not dropped")
			}
			if st, _, _ := cl.do("GET", "/redfish/v1/Systems/1", nil); st != 503 {
				t.Fatalf("restarting: %d", st)
			}
			cl.do("GET", "/redfish/v1", nil) // last 503
			if st, _, _ := cl.do("GET", "/redfish/v1/Systems/1", nil); st != 401 {
				t.Fatalf("after restart the session is gone: %d", st)
			}
		} else {
			if err != nil {
				t.Fatalf("no restart wanted: %v", err)
			}
			resp.Body.Close()
		}
	}
}

// TestFirmwareDefaultsUnchanged: the pre-existing behaviours answer as
// before: a PATCH of the System's Boot still works and a tree without a
// Bios settings object still refuses a Bios PATCH.
func TestFirmwareDefaultsUnchanged(t *testing.T) {
	_, cl := start(t, bmcsim.Config{Tree: tree(t, "openbmc-bmcweb-stock")})
	cl.login("admin", "pw")
	if st, _, _ := cl.do("PATCH", "/redfish/v1/Systems/system/Bios", map[string]any{"Attributes": map[string]any{"x": 1}}); st != 405 {
		t.Fatalf("bios patch on bmcweb: %d", st)
	}
}

// TestFirmwareVendorDeviations: behaviours real BMCs show that the
// emulator models:
//   - Supermicro's Bios lists no SupportedApplyTimes and refuses a PATCH
//     carrying @Redfish.SettingsApplyTime (Base PropertyUnknown), where
//     a BMC that lists them takes one;
//   - iDRAC ends a failed update's task Completed with TaskStatus
//     Critical, where iLO ends it in Exception;
//   - with FetchImages, SimpleUpdate downloads its ImageURI: a 200 is
//     recorded with its bytes' SHA-256, a 404 ends the task failed with
//     Update.1.0.TransferFailed.
func TestFirmwareVendorDeviations(t *testing.T) {
	_, smc := start(t, bmcsim.Config{Tree: tree(t, "supermicro-sys821ge-tnhr-x13")})
	smc.login("admin", "pw")
	at := map[string]any{"@Redfish.SettingsApplyTime": map[string]any{"ApplyTime": "OnReset"}, "Attributes": map[string]any{"AES_NI_3C75": "Disable"}}
	if st, _, m := smc.do("PATCH", "/redfish/v1/Systems/1/Bios/SD", at); st != 400 || !strings.Contains(fmt.Sprint(m), "PropertyUnknown") {
		t.Errorf("Supermicro PATCH with SettingsApplyTime: %d %v; want 400 PropertyUnknown", st, m)
	}
	_, dell := start(t, bmcsim.Config{Tree: tree(t, "dell-poweredge-r750-idrac9")})
	dell.login("admin", "pw")
	if st, _, m := dell.do("PATCH", "/redfish/v1/Systems/System.Embedded.1/Bios/Settings", map[string]any{"@Redfish.SettingsApplyTime": map[string]any{"ApplyTime": "OnReset"}, "Attributes": map[string]any{"ProcVirtualization": "Disabled"}}); st != 202 {
		t.Errorf("iDRAC PATCH with SettingsApplyTime OnReset: %d %v; want 202 (a job)", st, m)
	}

	files := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/fw/BIOS_1.9.0.bin" {
			http.NotFound(w, r)
			return
		}
		w.Write([]byte("bios"))
	}))
	defer files.Close()
	for _, c := range []struct {
		tree, image, state, status, msg string
	}{
		{"dell-poweredge-r750-idrac9", "/fw/Zzz_1.0.bin", "Completed", "Critical", "TransferFailed"},
		{"hpe-proliant-dl385gen10plusv2-ilo5", "/fw/Zzz_1.0.bin", "Exception", "Critical", "TransferFailed"},
		{"dell-poweredge-r750-idrac9", "/fw/BIOS_1.9.0.bin", "Completed", "OK", "UpdateSuccessful"},
	} {
		sim, cl := start(t, bmcsim.Config{Tree: tree(t, c.tree), Firmware: bmcsim.Firmware{UpdatePolls: 1, RestartRequests: -1, FetchImages: true}})
		cl.login("admin", "pw")
		st, h, m := cl.do("POST", "/redfish/v1/UpdateService/Actions/UpdateService.SimpleUpdate", map[string]any{"ImageURI": files.URL + c.image})
		if st != 202 {
			t.Fatalf("%s %s: update %d %v", c.tree, c.image, st, m)
		}
		for i := 0; i < 3; i++ {
			_, _, m = cl.do("GET", h.Get("Location"), nil)
		}
		if m["TaskState"] != c.state || m["TaskStatus"] != c.status || !strings.Contains(fmt.Sprint(m["Messages"]), c.msg) {
			t.Errorf("%s %s: task %v; want %s, %s, %s", c.tree, c.image, m, c.state, c.status, c.msg)
		}
		f := sim.ImageFetches()
		sum := sha256.Sum256([]byte("bios"))
		if c.msg == "UpdateSuccessful" && (len(f) != 1 || f[0].Status != 200 || f[0].SHA256 != hex.EncodeToString(sum[:])) {
			t.Errorf("%s: fetches %+v; want one 200 of the file", c.image, f)
		}
		if c.msg == "TransferFailed" && (len(f) != 1 || f[0].Status != 404 || f[0].Err == "") {
			t.Errorf("%s: fetches %+v; want one 404", c.image, f)
		}
	}
}
