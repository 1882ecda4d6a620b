package bmcsim_test

import (
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/machina-metal/machina/bmc/bmcsim"
)

// TestInsertMediaFetchesImage: with FetchMedia the BMC reads the image URL
// before accepting an insert, as iDRAC, iLO and XCC do; an unreadable URL
// fails the insert with the Base message and the slot stays empty. Without
// it (the zero Config) any URL is accepted, as before.
func TestInsertMediaFetchesImage(t *testing.T) {
	var ranges []string
	img := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ranges = append(ranges, r.Header.Get("Range"))
		switch r.URL.Path {
		case "/ok.iso":
			w.Header().Set("Content-Range", "bytes 0-2047/4096")
			w.WriteHeader(http.StatusPartialContent)
			_, _ = w.Write(make([]byte, 2048))
		case "/secret.iso":
			http.Error(w, "no", http.StatusUnauthorized)
		default:
			http.NotFound(w, r)
		}
	}))
	defer img.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + ln.Addr().String() + "/gone.iso"
	ln.Close() // nothing listens there now

	sys := "/redfish/v1/Systems/System.Embedded.1"
	act := sys + "/VirtualMedia/1/Actions/VirtualMedia.InsertMedia"
	_, c := start(t, bmcsim.Config{Tree: tree(t, "dell-poweredge-r750-idrac9"), FetchMedia: true, MediaClient: &http.Client{Timeout: 10 * time.Second}})
	c.login("admin", "pw")
	for _, tc := range []struct {
		url, msg string
	}{
		{dead, "CouldNotEstablishConnection"},
		{img.URL + "/secret.iso", "ResourceAtUriUnauthorized"},
		{img.URL + "/missing.iso", "CouldNotEstablishConnection"},
	} {
		st, _, body := c.do("POST", act, map[string]any{"Image": tc.url})
		if st != 400 || !strings.HasSuffix(msgID(body), "."+tc.msg) {
			t.Errorf("insert %s: %d %q, want 400 %s", tc.url, st, msgID(body), tc.msg)
		}
		if _, _, vm := c.do("GET", sys+"/VirtualMedia/1", nil); vm["Inserted"] == true {
			t.Fatalf("insert %s failed but the slot shows inserted", tc.url)
		}
	}
	if st, _, _ := c.do("POST", act, map[string]any{"Image": img.URL + "/ok.iso"}); st != 204 {
		t.Fatalf("insert of a readable image: %d", st)
	}
	if len(ranges) != 3 || ranges[2] != "bytes=0-2047" {
		t.Errorf("image server saw Range headers %q, want three requests asking bytes=0-2047", ranges)
	}

	_, plain := start(t, bmcsim.Config{Tree: tree(t, "dell-poweredge-r750-idrac9")})
	plain.login("admin", "pw")
	if st, _, _ := plain.do("POST", act, map[string]any{"Image": dead}); st != 204 {
		t.Fatalf("zero Config: insert of an unreachable URL = %d, want 204 (not fetched)", st)
	}
}

// TestPowerTransition: with PowerTransition a reset shows PoweringOn or
// PoweringOff until it is done, or the old state with
// PowerTransitionKeepsState; the zero Config shows the change at once.
func TestPowerTransition(t *testing.T) {
	sys := "/redfish/v1/Systems/437XR1138R2"
	reset := sys + "/Actions/ComputerSystem.Reset"
	for _, tc := range []struct {
		name string
		d    time.Duration
		keep bool
		want string
	}{
		{"instant", 0, false, "On,On|Off,Off"},
		{"powering", 10 * time.Second, false, "PoweringOn,On|PoweringOff,Off"},
		{"keeps-old-state", 10 * time.Second, true, "Off,On|On,Off"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
			_, c := start(t, bmcsim.Config{Tree: tree(t, "dmtf-public-rackmount1"), Power: bmcsim.NewMemoryPower(false), Now: clk.now,
				SessionTimeout: -1, PowerTransition: tc.d, PowerTransitionKeepsState: tc.keep})
			c.login("admin", "pw")
			var got []string
			for _, rt := range []string{"On", "ForceOff"} {
				if st, _, _ := c.do("POST", reset, map[string]any{"ResetType": rt}); st != 204 {
					t.Fatalf("%s: %d", rt, st)
				}
				_, _, b := c.do("GET", sys, nil)
				during := b["PowerState"]
				clk.add(11 * time.Second)
				_, _, b = c.do("GET", sys, nil)
				got = append(got, during.(string)+","+b["PowerState"].(string))
			}
			if g := strings.Join(got, "|"); g != tc.want {
				t.Errorf("PowerState during,after On | ForceOff = %s, want %s", g, tc.want)
			}
		})
	}
}

// TestNetworkFirstAndContinuousReverts: NetworkFirst stores the override
// but the host is always told to boot the network; ContinuousReverts
// consumes a Continuous override at the next host start.
func TestNetworkFirstAndContinuousReverts(t *testing.T) {
	sys := "/redfish/v1/Systems/System.Embedded.1"
	hdd := map[string]any{"Boot": map[string]any{"BootSourceOverrideTarget": "Hdd", "BootSourceOverrideEnabled": "Continuous"}}
	pxe := map[string]any{"Boot": map[string]any{"BootSourceOverrideTarget": "Pxe", "BootSourceOverrideEnabled": "Continuous"}}

	be := &hookBackend{}
	q := bmcsim.DefaultQuirks("Dell")
	q.NetworkFirst = true
	_, c := start(t, bmcsim.Config{Tree: tree(t, "dell-poweredge-r750-idrac9"), Power: be, Quirks: &q})
	c.login("admin", "pw")
	if st, _, _ := c.do("PATCH", sys, hdd); st != 204 {
		t.Fatalf("network-first: boot patch %d", st)
	}
	_, _, b := c.do("GET", sys, nil)
	if boot := b["Boot"].(map[string]any); boot["BootSourceOverrideTarget"] != "Hdd" || boot["BootSourceOverrideEnabled"] != "Continuous" {
		t.Errorf("network-first: override reads %v, want the stored Hdd/Continuous", boot)
	}
	if strings.Join(be.calls, "|") != "boot Pxe Continuous" {
		t.Errorf("network-first: backend calls %q, want the host told Pxe", be.calls)
	}

	be = &hookBackend{}
	q = bmcsim.DefaultQuirks("Dell")
	q.ContinuousReverts = true
	_, c = start(t, bmcsim.Config{Tree: tree(t, "dell-poweredge-r750-idrac9"), Power: be, Quirks: &q})
	c.login("admin", "pw")
	if st, _, _ := c.do("PATCH", sys, pxe); st != 204 {
		t.Fatalf("continuous-reverts: boot patch %d", st)
	}
	_, _, b = c.do("GET", sys, nil)
	if boot := b["Boot"].(map[string]any); boot["BootSourceOverrideEnabled"] != "Continuous" {
		t.Errorf("continuous-reverts: before the boot the override reads %v, want Continuous", boot)
	}
	if st, _, _ := c.do("POST", sys+"/Actions/ComputerSystem.Reset", map[string]any{"ResetType": "On"}); st != 204 {
		t.Fatalf("reset: %d", st)
	}
	_, _, b = c.do("GET", sys, nil)
	if boot := b["Boot"].(map[string]any); boot["BootSourceOverrideEnabled"] != "Disabled" || boot["BootSourceOverrideTarget"] != "None" {
		t.Errorf("continuous-reverts: after the boot the override reads %v, want Disabled/None", boot)
	}
	if strings.Join(be.calls, "|") != "boot Pxe Continuous|boot None Disabled" {
		t.Errorf("continuous-reverts: backend calls %q", be.calls)
	}
}
